"""Jacobian norms ||d h_j^(L) / d h_i^(0)||_F of one sequence (Barbero et al. 2025, Sec. 3).

Exact, by reverse-mode autograd (`jacobian_norms`), or the forward-mode
Hutchinson estimate (`jacobian_norms_hutchinson`) for longer prompts.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor

from sinkmech.loading.backend import Model, forward
from sinkmech.hooks import act_name, cached_run, right_padding


def _check_layers(model: Model, n_layers: int | None) -> int:
    L = model.cfg.n_layers if n_layers is None else n_layers
    if not 1 <= L <= model.cfg.n_layers:
        raise ValueError(f"n_layers must lie in [1, {model.cfg.n_layers}], got {n_layers}")
    return L


def jacobian_norms(
    model: Model, tokens: Int[Tensor, " pos"], *, n_layers: int | None = None, chunk_size: int = 256
) -> Float[Tensor, "query_pos key_pos"]:
    """||d h_j^(L) / d h_i^(0)||_F for every output position j and input position i.

    Args:
        tokens: one sequence (with `<bos>` already prepended or not).
        n_layers: L, the depth of the output (default: all layers).

    Returns:
        [j, i]; zero above the diagonal (causality).
    """
    L = _check_layers(model, n_layers)
    f, h0 = _input_map(model, tokens, L)
    with _input_derivatives_only(model):
        jac = torch.func.jacrev(f, chunk_size=chunk_size)(h0)  # [j, d, i, d]
    return jac.detach().pow(2).sum((1, 3)).sqrt()


def _input_map(model: Model, tokens: Int[Tensor, " pos"], L: int):
    """h^(0) of one sequence (the residual entering layer 0) and the map h^(0) -> h^(L)."""
    _, cache = cached_run(model, tokens[None], [act_name("resid_pre", 0)], stop_at_layer=1)
    h0 = cache[act_name("resid_pre", 0)][0].detach()

    def f(x: Tensor) -> Tensor:
        return forward(model, x[None], start_at_layer=0, stop_at_layer=L)[0]

    return f, h0


@contextmanager
def _input_derivatives_only(model: Model):
    """Derivatives w.r.t. the input only: with parameters requiring grad, a
    vmapped backward also builds per-cotangent weight gradients (chunk x
    n_params floats: > 20 GB on SmolLM2)."""
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        with right_padding(model):
            yield
    finally:
        for p in params:
            p.requires_grad_(True)


def jacobian_norms_hutchinson(
    model: Model,
    tokens: Int[Tensor, " pos"],
    *,
    n_probes: int = 16,
    n_layers: int | None = None,
    seed: int = 0,
    chunk_size: int = 64,
) -> Float[Tensor, "query_pos key_pos"]:
    """Forward-mode Hutchinson estimate of ||d h_j^(L) / d h_i^(0)||_F.

    For each input position i, `n_probes` Rademacher probes v (E[v v^T] = I,
    so E ||J_ji v||^2 = ||J_ji||_F^2) are pushed forward with
    `torch.func.jvp`, vmapped over probes and positions: T x n_probes
    forward-mode passes give every output position j at once, where the exact
    `jacobian_norms` needs T x d_model backward rows. The squared norms are
    averaged over the probes, then square-rooted (unbiased for the square).

    Args:
        tokens: one sequence (with `<bos>` already prepended or not).
        n_probes: probes per input position; the relative standard deviation
            of each squared entry is at most sqrt(2 / n_probes).
        seed: the probes' seed (the same seed, the same probes).
        chunk_size: tangents pushed at once; memory grows with it.

    Returns:
        [j, i]; zero above the diagonal (causality).
    """
    if isinstance(n_probes, bool) or not isinstance(n_probes, int) or n_probes < 1:
        raise ValueError(f"n_probes must be a positive integer, got {n_probes!r}")
    L = _check_layers(model, n_layers)
    f, h0 = _input_map(model, tokens, L)
    T, d = h0.shape
    g = torch.Generator().manual_seed(seed)
    probes = (torch.randint(0, 2, (T, n_probes, d), generator=g) * 2 - 1).to(h0.dtype).to(h0.device)
    tangents = torch.zeros(T, n_probes, T, d, dtype=h0.dtype, device=h0.device)
    idx = torch.arange(T, device=h0.device)
    tangents[idx, :, idx] = probes  # probe k of position i perturbs position i only
    with _input_derivatives_only(model):
        pushed = torch.func.vmap(lambda t: torch.func.jvp(f, (h0,), (t,))[1], chunk_size=chunk_size)(
            tangents.reshape(T * n_probes, T, d))  # [i * probe, j, d]
    squared = pushed.detach().float().pow(2).sum(-1).reshape(T, n_probes, T).mean(1)  # [i, j]
    return squared.T.sqrt()
