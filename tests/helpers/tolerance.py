"""How far apart two computation orders of one result may lie: the float32 error model every
equality test between two orders (shards against one run, batched against a loop, a fused
path against the pattern, Ray against local) takes its tolerance from.

u = 2**-24 is float32's unit roundoff (float64's: 2**-53). Two bounds on a sum of n terms:
- worst case (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 3.4 and
  Lemma 3.1): in any order, within gamma(n) = n u / (1 - n u) of sum |terms|; two orders
  therefore differ by at most 2 gamma(n) sum |terms|;
- probable (Higham and Mary 2019, SIAM J. Sci. Comput. 41(5), A2815, Theorem 3.1): with the
  rounding errors independent and mean-zero, within lam sqrt(n) u of it with probability at
  least 1 - 2 exp(-lam**2 / 2) (lam = 4: 0.9993), since worst-case alignment of n errors is
  what never happens in a forward pass.

Which applies where:
- SAME_TERMS: both orders compute the same float32 terms bit for bit (the same forward
  passes, e.g. every prompt in its own batch) and only add them up in another order, in
  float64 (the parts' sums): gamma(n, float64) < 1e-12 for n < 1e4, then each stored value is
  rounded once to float32 (within one ulp, 2u, of each other) and may pass through a few more
  float32 operations (a mean divided, a difference): 16 u = 9.5e-7.
- forward_rtol(k): the two orders run float32 forward passes of other shapes (another batch
  size or padding, a restarted pass, other kernels: AVX2 against AVX-512, another thread
  count), so each float32 dot product of the pass may be summed in another order; the
  longest one, k terms (d_mlp), bounds the rest: the probable bound 4 sqrt(k) u, compared
  normwise (relative to the array's largest |value|, so a near-zero entry of a large array is
  held to the array's scale, as float32 computed it). SmolLM2 (d_mlp 1536): 9.3e-6; the
  tiny models (d_mlp 128): 2.7e-6.
- kl_atol(d_vocab): a KL divergence between two such passes' distributions, whose error is
  set by the log-probs it is the weighted difference of, not by its own size (see there).
- sum_of_changes_atol(...): a sum of n differences (intervened - clean) of float32 values
  of size `scale`, e.g. the no-op check's summed loss changes: each difference carries the
  forward bound twice, and n independent errors add like sqrt(n).
"""

from __future__ import annotations

import math

U32 = 2.0 ** -24
U64 = 2.0 ** -53

# A mid-size model's widest float32 accumulation (SmolLM2's d_mlp); the tiny models' is 128.
SMOLLM2_D_MLP = 1536
TINY_D_MLP = 128


def gamma(n: int, u: float = U32) -> float:
    """Higham's worst-case relative bound of a sum of n terms in any order (of sum |terms|)."""
    if n * u >= 1:
        raise ValueError(f"gamma({n}) is unbounded at u = {u:g}")
    return n * u / (1 - n * u)


def probable(n: int, u: float = U32, lam: float = 4.0) -> float:
    """Higham and Mary's probable relative bound of a sum of n terms: lam sqrt(n) u."""
    return lam * math.sqrt(n) * u


SAME_TERMS = 16 * U32  # the same float32 terms, added in float64 in another order (see above)


def forward_rtol(k: int = SMOLLM2_D_MLP) -> float:
    """Normwise bound between two float32 forward computations of one result whose widest
    accumulation has k terms (default SmolLM2's d_mlp): the probable bound 4 sqrt(k) u."""
    return probable(k)


def sum_of_changes_atol(n_terms: int, scale: float, k: int = TINY_D_MLP) -> float:
    """Absolute bound on a sum of `n_terms` differences of two float32 values of size up to
    `scale` (e.g. next-token losses, nats), computed by passes of other shapes: each value
    within forward_rtol(k) * scale, a difference within twice that, n independent such errors
    within 4 sqrt(n) of one (the probable bound again)."""
    return 4 * math.sqrt(n_terms) * 2 * forward_rtol(k) * scale


TINY_FORWARD = forward_rtol(TINY_D_MLP)  # the tiny models' forward bound: 2.7e-6
SMOLLM2_FORWARD = forward_rtol(SMOLLM2_D_MLP)  # 9.3e-6


def assert_normwise(got, want, rtol: float, what: str = "") -> None:
    """max |got - want| <= rtol * max |want| (tensors or arrays of one shape): the normwise
    comparison of two float32 computation orders (a near-zero entry of a large array is held
    to the array's scale, as float32 computed it)."""
    import numpy as np

    def values(x):
        return x.detach().cpu().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)

    a, b = values(got), values(want)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    scale = float(np.abs(b).max()) if b.size else 0.0
    worst = float(np.abs(a - b).max()) if b.size else 0.0
    assert worst <= rtol * scale, f"{what}: max |difference| {worst:.3g} > {rtol:.3g} x largest |value| {scale:.3g}"


def kl_atol(d_vocab: int, k: int = TINY_D_MLP) -> float:
    """Absolute bound on a KL divergence (nats) between two next-token distributions computed by
    float32 passes of other shapes or kernels. KL(p || q) = sum p (log p - log q): each log-prob
    carries the forward bound relative to its size, and the p-weighted sizes add up to a cross
    entropy, about log(d_vocab) for a distribution near the other, so the KL carries twice the
    forward bound times log(d_vocab), however small the KL itself is (a small KL is a difference
    of two large terms, not a small number computed alone)."""
    return 2 * forward_rtol(k) * math.log(d_vocab)


def two_implementations(k: int = TINY_D_MLP) -> float:
    """Two implementations of one float32 model (sinkmech's seam and transformers' eager
    attention, say): each within the forward bound of the exact value and free to order every
    sum its own way, so within twice the bound of each other; twice again for the operations
    one fuses and the other does not (a scaled softmax, a fused norm): 4 forward_rtol(k)."""
    return 4 * forward_rtol(k)


BF16_U = 2.0 ** -8  # bfloat16's unit roundoff (8 bits of mantissa): what a bfloat16 model rounds each activation by
