"""Sink or `<bos>`: what removing `<bos>` takes away, taken apart.

`<bos>` at position 0 sees only itself, so its residual stream, keys and values
are the same for every prompt (`bos_state`): to a later token it is one constant
key and one constant value per head. Removing it takes two things from every
head: the attention **mass** the head parks on it, and the **value** it writes
(weighted by that mass). Two interventions give one back without the other
(Barbero et al. 2025 argue the sink's value is near zero, so the mass is what
matters: the sink is the head's no-op):

- `ValuelessBos`: `<bos>` kept, its value zeroed in the chosen heads (every head
  of every layer by default): the mass without the value. Applied on `hook_z`
  as z - A[:, 0] v_0, which is the head's output with v_0 = 0 for any grouping
  of key/value heads.
- `PhantomSink`, on the run without `<bos>`: at every (layer, head, query) the
  row's real keys are scaled by 1 - m (`hook_pattern`) and the head's output
  gets m u (`hook_z`): a sink that takes mass m and writes u. m is `paired`
  (the attention the same head put on `<bos>` at the same content query of the
  with-`<bos>` run: `paired_mass`) or from per-(layer, head) sink `logits` b,
  m = e^b / (e^b + sum_j e^{s_j}) over the row's scores (`logit_mass`: the
  mechanism of gpt-oss's learned sinks). u is zero, `<bos>`'s own value at
  that head, or a given [layer head d_head] tensor (`sinkmech.interventions.fit_sinks`).
  `mode="bias"`: the row is not rescaled, only m u is added (the value
  without the mass).

On a model without absolute positions (rotary), a content-content score is the
same with and without `<bos>` in front, so the paired phantom with u = `<bos>`'s
value reproduces the with-`<bos>` run up to float32 rounding, and m = 0 is the
run without `<bos>` (tests/unit/interventions/test_phantom.py). Hooks attach
through `model.hooks` (`sinkmech.hooks.run`), on both TransformerLens lines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from sinkmech.hooks import Hook, act_name, cached_run, check_head, check_layer, expand_kv
from sinkmech.loading.backend import Model
from sinkmech.prompts import TokenBatch

PhantomForm = Literal["paired", "logits"]
PhantomMode = Literal["dump", "bias"]
SinkValue = Literal["zero", "bos"]
FORMS: tuple[str, ...] = get_args(PhantomForm)
MODES: tuple[str, ...] = get_args(PhantomMode)
VALUES: tuple[str, ...] = get_args(SinkValue)

Heads = tuple[tuple[int, int], ...]


def head_selection(model: Model, layers: Sequence[int] | None = None,
                   heads: Sequence[tuple[int, int]] | None = None) -> Bool[Tensor, "layer head_index"]:
    """Which (layer, head) an intervention touches: the `heads` given, every head
    of the `layers` given, or (neither) every head of every layer."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    if layers is not None and heads is not None:
        raise ValueError("give layers or heads, not both")
    sel = torch.zeros(L, H, dtype=torch.bool)
    if heads is not None:
        if not heads:
            raise ValueError("heads is empty: give at least one (layer, head)")
        for l, h in heads:
            check_head(model, l, h)
            sel[l, h] = True
    elif layers is not None:
        if not layers:
            raise ValueError("layers is empty: give at least one layer")
        for l in layers:
            check_layer(model, l)
            sel[l] = True
    else:
        sel[:] = True
    return sel


@dataclass(frozen=True)
class ValuelessBos:
    """`<bos>` kept and every head's attention to it kept; its value vector zeroed
    in the chosen heads (`layers` or `heads`; neither: every head of every layer)."""

    layers: tuple[int, ...] | None = None
    heads: Heads | None = None

    def describe(self) -> dict:
        return {"kind": "valueless_bos", "layers": _listed(self.layers), "heads": _listed(self.heads)}


@dataclass(frozen=True, eq=False)
class PhantomSink:
    """A sink without a token, on the run without `<bos>` (see the module docstring).

    Attributes:
        form: "paired" (m from the with-`<bos>` run) or "logits" (m from `logits`).
        value: u: "zero", "bos" (`<bos>`'s own value at each head) or a tensor
            [layer head_index d_head] (fitted values).
        mode: "dump" (real keys scaled by 1 - m, m u added) or "bias" (m u added only).
        logits: with form "logits", one sink logit per (layer, head) ([layer
            head_index]; -inf: no sink at that head).
        layers, heads: where the phantom acts (neither: every head of every layer).
    """

    form: PhantomForm = "paired"
    value: SinkValue | Float[Tensor, "layer head_index d_head"] = "zero"
    mode: PhantomMode = "dump"
    logits: Float[Tensor, "layer head_index"] | None = None
    layers: tuple[int, ...] | None = None
    heads: Heads | None = None

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"phantom form must be one of {FORMS}, got {self.form!r}")
        if self.mode not in MODES:
            raise ValueError(f"phantom mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.value, str) and self.value not in VALUES:
            raise ValueError(f"phantom value must be one of {VALUES} or a [layer, head, d_head] tensor, got {self.value!r}")
        if (self.form == "logits") != (self.logits is not None):
            raise ValueError("the logits form needs sink logits, and only it takes them")
        if self.mode == "bias" and isinstance(self.value, str) and self.value == "zero":
            raise ValueError("bias mode adds m times a value and rescales nothing: with a zero value it changes nothing")

    def describe(self) -> dict:
        value = self.value if isinstance(self.value, str) else "given"
        return {"kind": "phantom", "form": self.form, "value": value, "mode": self.mode,
                "layers": _listed(self.layers), "heads": _listed(self.heads)}

    def check(self, model: Model) -> None:
        """Refuse logits or values whose shape does not fit `model`."""
        L, H, d = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
        if self.logits is not None and tuple(self.logits.shape) != (L, H):
            raise ValueError(f"sink logits of shape {list(self.logits.shape)} do not fit this model: it has "
                             f"{L} layers x {H} heads")
        if isinstance(self.value, Tensor) and tuple(self.value.shape) != (L, H, d):
            raise ValueError(f"sink values of shape {list(self.value.shape)} do not fit this model: it needs "
                             f"[{L}, {H}, {d}] (layers, heads, d_head)")
        head_selection(model, self.layers, self.heads)


def _listed(x):
    return None if x is None else [list(v) if isinstance(v, tuple) else v for v in x]


# What every prompt's <bos> is, whatever follows it


@dataclass(frozen=True)
class BosState:
    """`<bos>` at position 0, alone: it attends only to itself, so this is what it
    is in every prompt. Residual entering each layer (and the last output),
    and its key and value per query head."""

    resid: Float[Tensor, "resid_layer d_model"]
    keys: Float[Tensor, "layer head_index d_head"]
    values: Float[Tensor, "layer head_index d_head"]


def bos_state(model: Model, bos_token_id: int | None = None) -> BosState:
    """One forward pass of `<bos>` alone (the tokenizer's `<bos>` unless given)."""
    if bos_token_id is None:
        from sinkmech.loading.models import bos_token_id as model_bos

        bos_token_id = model_bos(model)
    L = model.cfg.n_layers
    resid = [act_name("resid_pre", l) for l in range(L)] + [act_name("resid_post", L - 1)]
    kv = [act_name(n, l) for l in range(L) for n in ("k", "v")]
    tokens = torch.tensor([[int(bos_token_id)]], device=model.cfg.device)
    _, cache = cached_run(model, tokens, resid + kv, stop_at_layer=L)
    return BosState(
        resid=torch.stack([cache[n][0, 0] for n in resid]).float(),
        keys=torch.stack([expand_kv(model, cache[act_name("k", l)][0, 0]) for l in range(L)]).float(),
        values=torch.stack([expand_kv(model, cache[act_name("v", l)][0, 0]) for l in range(L)]).float(),
    )


def with_bos_column(content: TokenBatch, bos_token_id: int) -> TokenBatch:
    """The same content with `<bos>` put in front: content position j at j + 1."""
    if content.bos != "none":
        raise ValueError("a phantom sink acts on the run without <bos>: build the batch with bos='none'")
    col = torch.full((len(content), 1), int(bos_token_id), dtype=content.tokens.dtype, device=content.tokens.device)
    return TokenBatch(torch.cat([col, content.tokens], 1), content.lengths + 1, "prepend", int(bos_token_id),
                      content.context_limit)


def paired_mass(model: Model, content: TokenBatch, bos_token_id: int,
                fwd_hooks: Sequence[Hook] = ()) -> Float[Tensor, "batch layer head_index query_pos"]:
    """m of the paired phantom for one batch of content tokens (bos="none"): the
    attention each head puts on `<bos>` at content query j of the with-`<bos>`
    run (its position j + 1). Zero on padding queries. `fwd_hooks` run in that
    with-`<bos>` pass (e.g. a one-token swap is in the tokens, not here)."""
    first = with_bos_column(content, bos_token_id)
    L, n = model.cfg.n_layers, content.tokens.shape[1]
    out = torch.zeros(len(content), L, model.cfg.n_heads, n, device=content.tokens.device)

    def keep(pattern, hook):
        out[:, hook.layer()] = pattern[:, :, 1:, 0].float()

    cached_run(model, first.tokens, [], [*fwd_hooks, *((act_name("pattern", l), keep) for l in range(L))],
               stop_at_layer=L)
    return out * content.mask[:, None, None, :].to(out)


def logit_mass(scores: Float[Tensor, "batch head_index query_pos key_pos"],
               logits: Float[Tensor, " head_index"]) -> Float[Tensor, "batch head_index query_pos"]:
    """The share a sink logit b takes of each row: e^b / (e^b + sum_j e^{s_j}) over the
    row's scores (masked keys hold -inf or the dtype's lowest value and add nothing),
    i.e. sigmoid(b - logsumexp(s)); b = -inf gives 0."""
    lse = torch.logsumexp(scores.float(), dim=-1)
    return torch.sigmoid(logits.to(lse)[None, :, None] - lse)


# Hook builders


def valueless_bos_hooks(model: Model, spec: ValuelessBos) -> list[Hook]:
    """`ValuelessBos` as hooks: per layer with a chosen head, A[:, :, :, 0] and v_0 are
    read and the chosen heads' outputs become z - A[:, 0] v_0 (v_0 = 0)."""
    sel = head_selection(model, spec.layers, spec.heads)
    hooks: list[Hook] = []
    for l in range(model.cfg.n_layers):
        if not sel[l].any():
            continue
        held: dict[str, Tensor] = {}
        chosen = sel[l]

        def keep_pattern(pattern, hook, held=held):
            held["a0"] = pattern[:, :, :, 0]  # [batch head query]

        def keep_value(v, hook, held=held):
            held["v0"] = expand_kv(model, v[:, 0])  # [batch head d_head]

        def write(z, hook, held=held, chosen=chosen):
            a0, v0 = held.pop("a0"), held.pop("v0")
            w = a0 * chosen.to(a0.device, a0.dtype)[None, :, None]
            return z - torch.einsum("bhq,bhd->bqhd", w, v0.to(z.dtype))

        hooks += [(act_name("v", l), keep_value), (act_name("pattern", l), keep_pattern), (act_name("z", l), write)]
    return hooks


def phantom_hooks(
    model: Model,
    spec: PhantomSink,
    *,
    mass: Float[Tensor, "batch layer head_index query_pos"] | None = None,
    bos_value: Float[Tensor, "layer head_index d_head"] | None = None,
    record: Callable[[int, Tensor], None] | None = None,
) -> list[Hook]:
    """`PhantomSink` as hooks on one batch of the run without `<bos>`.

    Args:
        mass: the paired form's m for this batch (`paired_mass`).
        bos_value: `<bos>`'s value per head (`bos_state(...).values`), for value="bos".
        record: called with (layer, m [batch head_index query_pos]) once per
            layer as the pass runs (the mass given back; zero outside the chosen heads).

    Returns:
        Hooks in the order they must run: the logits form's on `attn_scores`,
        the rescale on `pattern` (dump mode), the value on `z`.
    """
    sel = head_selection(model, spec.layers, spec.heads)
    if spec.form == "paired" and mass is None:
        raise ValueError("the paired phantom needs the paired mass (paired_mass) of this batch")
    if isinstance(spec.value, Tensor):
        u = spec.value
    elif spec.value == "bos":
        if bos_value is None:
            raise ValueError("value='bos' needs <bos>'s value per head (bos_state(model).values)")
        u = bos_value
    else:
        u = None
    hooks: list[Hook] = []
    for l in range(model.cfg.n_layers):
        if not sel[l].any():
            continue
        held: dict[str, Tensor] = {}
        chosen = sel[l]

        def from_logits(scores, hook, held=held, chosen=chosen, l=l):
            m = logit_mass(scores, spec.logits[l].to(scores.device))
            held["m"] = m * chosen.to(m.device, m.dtype)[None, :, None]

        def given(pattern, hook, held=held, chosen=chosen, l=l):
            held["m"] = mass[:, l, :, : pattern.shape[-2]].to(pattern.device) * chosen.to(pattern.device)[None, :, None]

        def rescale(pattern, hook, held=held):
            m = held["m"]
            if record is not None:
                record(hook.layer(), m.detach())
            if spec.mode == "bias":
                return None
            return pattern * (1.0 - m.to(pattern.dtype))[..., None]

        def add_value(z, hook, held=held, l=l):
            m = held.pop("m")
            return z + torch.einsum("bhq,hd->bqhd", m.to(z.dtype), u[l].to(z.device, z.dtype))

        if spec.form == "logits":
            hooks.append((act_name("attn_scores", l), from_logits))
        else:
            hooks.append((act_name("pattern", l), given))
        hooks.append((act_name("pattern", l), rescale))
        if u is not None:
            hooks.append((act_name("z", l), add_value))
    return hooks
