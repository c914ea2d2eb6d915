"""Attribution patching for per-head ablations: every head from one forward and
one backward pass (Nanda 2023, "Attribution patching"; Kramár et al. 2024, AtP).

Each ablation replaces a head's output z by z' (computable for all heads from
the clean run's patterns and values). To first order the metric moves by
grad_z M . (z' - z). The KL metric has zero gradient at the clean run, so for
it we use the second-order (Fisher) term instead:
KL ~ 1/2 E_y[(grad_z log q(y) . (z' - z))^2] with y sampled from the clean
next-token distribution, estimated with `samples` label draws stacked in one
batch (one forward, one backward).
"""

from __future__ import annotations


import torch
from jaxtyping import Float
from torch import Tensor

from sinkmech.loading.backend import Model
from sinkmech.hooks import act_name, expand_kv, right_padding
from sinkmech.interventions.ablation import AblationMode, HeadAblation, ablation_setup
from sinkmech.interventions.metrics import KL, MetricSpec, content_logits, whole
from sinkmech.prompts import Bos, PromptSource, TokenBatch
from sinkmech.options import QUIET, RunOptions


def ablated_z(
    mode: AblationMode,
    z: Float[Tensor, "batch pos head_index d_head"],
    pattern: Float[Tensor, "batch head_index query_pos key_pos"],
    v: Float[Tensor, "batch pos head_index d_head"],
    mean: Float[Tensor, "head_index d_head"] | None,
) -> Float[Tensor, "batch pos head_index d_head"]:
    """What every head would output under `mode`, all heads at once (v expanded to query heads)."""
    if mode == "zero":
        return torch.zeros_like(z)
    if mode == "mean":
        return mean.to(z).expand_as(z)
    if mode == "all_to_first":
        return v[:, :1].expand_as(z)
    p = pattern.clone()
    if mode == "drop_sink":  # rows over the real keys alone, as in hooks.drop_sink_hook
        p = p / p.sum(-1, keepdim=True)
    else:  # mask_first: query 0 keeps its only key, as in hooks.mask_first_hook
        left = 1.0 - p[:, :, 1:, :1]  # what key 0 leaves: keys 1 .. t and a learned sink's share
        p[:, :, 1:, 0] = 0.0
        p[:, :, 1:] = p[:, :, 1:] / left
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def pearson(a: Tensor, b: Tensor) -> float:
    """Pearson correlation of two tensors' entries."""
    a, b = a.flatten().double(), b.flatten().double()
    a, b = a - a.mean(), b - b.mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def attribute_ablations(
    model: Model,
    tokens: PromptSource | TokenBatch,
    *,
    mode: AblationMode,
    bos: Bos | None = None,
    metric: MetricSpec = "kl",
    samples: int = 8,
    seed: int = 0,
    max_tokens: int = 64,
    options: RunOptions = QUIET,
) -> HeadAblation:
    """Estimate `head_ablations` for all heads from one forward and one backward.

    Args:
        tokens, bos, mode, metric: as in `head_ablations` (the setup is
            `ablation_setup`'s); a callable metric must be differentiable.
        samples: label draws for the KL (Fisher) estimate, stacked as copies of
            the batch; ignored for other metrics (first-order, one copy).
        options: the `<bos>` id for prompts of a model without a tokenizer.

    Every head is estimated from the same forward and backward pass, so there
    is no sub-grid to choose: index the [layer, head_index] effects instead.

    Returns:
        HeadAblation with method "attribution" and estimated effects.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    s = ablation_setup(model, tokens, mode=mode, metric=metric, bos=bos, max_tokens=max_tokens, options=options)
    batch, mask, ref, means, n_content = s.batch, s.mask, s.reference, s.means, s.n_content
    B, T = batch.tokens.shape
    L = model.cfg.n_layers
    fisher = isinstance(s.metric, KL)
    S = samples if fisher else 1

    leaves: dict[int, Tensor] = {}
    clean: dict[tuple[str, int], Tensor] = {}

    def leaf_z(z, hook):
        leaves[hook.layer()] = z.detach().requires_grad_(True)
        return leaves[hook.layer()]

    def keep(name: str, layer: int):
        # bound here: on the Bridge `hook.name` is the hook's own name, not the alias asked for
        def hook(x, hook):
            clean[(name, layer)] = x[:B].detach()
        return hook

    hooks = [(act_name("z", l), leaf_z) for l in range(L)]
    hooks += [(act_name(n, l), keep(f"hook_{n}", l)) for l in range(L) for n in ("pattern", "v")]
    with torch.enable_grad(), right_padding(model), model.hooks(fwd_hooks=hooks):
        logits = content_logits(model(batch.tokens.repeat(S, 1)), batch.offset, n_content)
        logits = logits.reshape(S, B, n_content, -1)
        if fisher:
            g = torch.Generator(device="cpu").manual_seed(seed)
            probs = torch.softmax(whole(ref).float(), -1).cpu()
            y = torch.multinomial(probs.reshape(-1, probs.shape[-1]), S, replacement=True, generator=g)
            y = y.T.reshape(S, B, n_content).to(logits.device)
            lp = torch.log_softmax(logits.float(), -1).gather(-1, y[..., None])[..., 0]
            objective = (lp * mask.float()).sum()
        else:
            objective = s.score(logits).sum()
        grads = torch.autograd.grad(objective, [leaves[l] for l in range(L)])
    baseline = 0.0 if fisher else s.baseline
    effects = torch.zeros(L, model.cfg.n_heads)
    for l in range(L):
        z = leaves[l][:B].detach()
        v = expand_kv(model, clean[("hook_v", l)])
        delta = ablated_z(mode, z, clean[("hook_pattern", l)], v, None if means is None else means[l]) - z
        grad = grads[l].reshape(S, B, T, *z.shape[2:])
        dots = torch.einsum("sbphd,bphd->sh", grad.float(), delta.float())
        if fisher:
            effects[l] = (dots.pow(2).mean(0) / (2 * mask.sum())).cpu()
        else:
            effects[l] = (baseline + dots[0]).cpu()
    return s.result(effects[list(s.layers)][:, list(s.heads)], "attribution", baseline=baseline)
