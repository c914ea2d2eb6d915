"""Dormant ("if-else") heads: per-head profiles, streamed over a corpus.

A dormant head rests on the first token, whose value vector is tiny, and
wakes up on a trigger (Barbero et al. 2025, Sec. 3.2; Guo et al. 2024,
"Active-dormant attention heads"). For every (layer, head) one pass over the
corpus measures: the distribution over queries of the attention on the first
token (a query is *dormant* at >= `high`, *active* at <= `low`), value norms,
the head's output norm ||z W_O|| in each mode (Sandoval-Segura et al. 2025),
q/k norm bands (`sinkmech.dormant.bands`) and triggers (`sinkmech.dormant.triggers`). Query 0
is left out everywhere: it can only attend to itself.
"""

from __future__ import annotations

import einops
import torch
from torch import Tensor
from tqdm.auto import tqdm

from sinkmech.measures.attention import sink_mass
from sinkmech.loading.backend import W_O, Model, attn_scale
from sinkmech.dormant.bands import band_layout, band_norms, band_products
from sinkmech.dormant.labels import HeadStats, Thresholds, classify
from sinkmech.dormant.queries import (PROMPT_SUMS, QueryRecords, bootstrap_labels, cuts, record_queries, sweep_cuts,
                                      threshold_sweep)
from sinkmech.dormant.result import HeadScan
from sinkmech.dormant.triggers import TriggerCounter, chosen_trigger, judge_by_prompt
from sinkmech.hooks import act_name, expand_kv, run
from sinkmech.prompts import Bos, PromptSource, TokenBatch, TokenStr, as_batch, token_text
from sinkmech.options import RunOptions
from sinkmech.readers import rides, same_prompts

__all__ = ["HeadScan", "ScanSums", "scan_heads", "scan_sums"]


def scan_heads(
    model: Model,
    tokens: TokenBatch | PromptSource,
    *,
    bos: Bos | None = None,
    max_tokens: int | None = None,
    thresholds: Thresholds = Thresholds(),
    top_triggers: int = 5,
    n_bins: int = 20,
    sweep: bool = True,
    n_boot: int = 200,
    options: RunOptions = RunOptions(),
    sums: ScanSums | None = None,
) -> HeadScan:
    """Profile every head in one streamed pass and label it (see `Thresholds`).

    Args:
        model: a HookedTransformer or a TransformerBridge (`sinkmech.loading.backend`).
        tokens: a `TokenBatch` (`sinkmech.prompts.tokenize`), or prompts to
            tokenize once: strings, a .txt/.jsonl path, token-id lists or None
            (default corpus).
        bos: "prepend" (default for prompts) or "none"; the first token is
            position 0 either way. With a TokenBatch: its own, or the same.
        max_tokens: content tokens per prompt (default 64 for prompts).
        thresholds: the query modes' cut and the labels' rules (default
            `Thresholds()`, calibrated: docs/dormant_calibration.md), e.g.
            `Thresholds(high=0.3)`.
        top_triggers: triggers kept per head and place (query / previous / key),
            chosen on the even-numbered prompts, judged on the odd-numbered
            ones (`sinkmech.dormant.triggers`).
        n_bins: histogram bins of first-token attention.
        sweep: also label every head at the cuts of
            `sinkmech.dormant.queries.SWEEP_HIGH` x `SWEEP_LOW` (`HeadScan.sweep`).
        n_boot: bootstrap resamples of the prompts for the label uncertainty
            (`HeadScan.uncertainty`; 0: none).
        options: batch size (default 16 prompts per forward pass), progress
            bar, and the `<bos>` id for prompts of a model without a tokenizer.
        sums: the running sums of these prompts, already filled by another
            streamed pass they rode (`scan_sums`); only the labels are left.

    Returns:
        HeadScan. `bands` holds [layer, head_index, band] means of the band
        norms `q_first`, `q_rest`, `k_first`, `k_rest` (first token vs the
        rest), `q_dormant`, `q_active` (by query mode), and the per-band
        shares of the attention logit q.k/scale: `logit_first_dormant`,
        `logit_first_active` (to the first key) and `logit_key_active` (to the
        most attended other key).
    """
    th = thresholds
    if n_bins < 2 or top_triggers < 1 or n_boot < 0:
        raise ValueError("need n_bins >= 2, top_triggers >= 1 and n_boot >= 0")
    batch = as_batch(model, tokens, bos=bos, default="prepend", max_tokens=max_tokens,
                     bos_token_id=options.bos_token_id)
    max_tokens = batch.max_content  # what max_tokens came to: shorter prompts keep their length
    if int(batch.lengths.max()) < 2:
        raise ValueError("every prompt has a single token: there is no query to scan")
    if sums is None:
        acc = accumulate(model, batch, th, n_bins=n_bins, options=options)
    else:
        acc = sums.filled(batch, th, n_bins)
    return acc.finish(th, decode=token_text(model), top_triggers=top_triggers, max_tokens=max_tokens, sweep=sweep,
                      n_boot=n_boot, progress=options.progress)


def accumulate(model: Model, batch: TokenBatch, th: Thresholds, *, n_bins: int = 20, first_prompt: int = 0,
               n_pos: int | None = None, options: RunOptions = RunOptions()) -> ScanSums:
    """The scan's running sums over `batch`, before any label (a shard of a corpus:
    `first_prompt` is the global index of its first prompt, `n_pos` the position
    width every shard shares; see `sinkmech.sharding.dormant.heads_partial`)."""
    acc = ScanSums(model, batch, th, n_bins, first_prompt=first_prompt, n_pos=n_pos)
    chunks = batch.batches(options.batch(16))
    for _, part in tqdm(chunks, desc="scan heads", disable=not options.progress, unit="batch"):
        run(model, part.tokens, acc.hooks(part), stop_at_layer=model.cfg.n_layers)
    return acc


def scan_sums(model: Model, batch: TokenBatch, *, thresholds: Thresholds = Thresholds(),
              n_bins: int = 20) -> ScanSums:
    """Empty running sums of a scan of `batch`, to fill in another streamed pass
    whose first chunks are these prompts (`sink_scores(..., also=sums.ride)`),
    then label with `scan_heads(..., sums=sums)`: one forward pass instead of two,
    the same numbers bit for bit (the same chunks run the same computation)."""
    return ScanSums(model, batch, thresholds, n_bins)


class ScanSums:
    """Running sums for `scan_heads`; each layer is reduced in its `z` hook."""

    def __init__(self, model: Model, batch: TokenBatch, th: Thresholds, n_bins: int, *,
                 first_prompt: int = 0, n_pos: int | None = None) -> None:
        cfg = model.cfg
        L, H, P = cfg.n_layers, cfg.n_heads, batch.tokens.shape[1] if n_pos is None else n_pos
        dev = cfg.device
        self.model, self.th, self.n_bins, self.batch = model, th, n_bins, batch
        self.layout = band_layout(model)
        C = self.layout.n_bands
        self.scale = [attn_scale(model, l) for l in range(L)]
        # ||z W_O||^2 = z G z with G = W_O W_O^T: d_head^2 work instead of d_head * d_model
        w_o = W_O(model).detach().float()
        self.gram = [einops.einsum(w_o[l], w_o[l], "h d m, h e m -> h d e") for l in range(L)]
        z = lambda *s: torch.zeros(*s, device=dev, dtype=torch.float64)  # noqa: E731
        self.sums = {k: z(L, H) for k in ("f", "f2", "f3", "f4", "n_dormant", "n_active", "v_first", "v_rest",
                                          "read_active", "read_dormant", "out_active", "out_dormant")}
        self.hist = z(L, H, n_bins)
        self.pos = {k: z(L, H, P) for k in ("f", "active")}
        self.pos_total = z(P)
        # per query and per prompt, for the sweep and the bootstrap (sinkmech.dormant.queries)
        N = len(batch)
        self.highs, self.lows = cuts(th)
        self.key_level = torch.zeros(N, L, H, P, dtype=torch.int32)
        self.per_prompt = {k: torch.zeros(N, L, H, dtype=torch.float64) for k in PROMPT_SUMS}
        self.cut_sums = {f"{w}_{m}": z(len(self.highs if m == "dormant" else self.lows), L, H)
                         for w in ("n", "out") for m in ("dormant", "active")}
        self.recorded = False  # an accumulator rebuilt from summed shards without records has none
        self.band_keys = ("q_first", "q_rest", "k_first", "k_rest", "q_dormant", "q_active",
                          "logit_first_dormant", "logit_first_active", "logit_key_active")
        self.band = {k: z(L, H, C) for k in self.band_keys}
        self.n_prompts = 0
        self.first_prompt = first_prompt
        self.next_prompt = first_prompt  # the global index of the next prompt (it decides a trigger's half)
        self.triggers = TriggerCounter(L, H, cfg.d_vocab, P, dev)
        self.rotary = cfg.positional_embedding_type == "rotary"

    def ride(self, rows: slice, part: TokenBatch) -> list:
        """The hooks for one chunk of another pass over a batch whose first prompts
        are this scan's, in chunks of the scan's own size (`scan_sums`,
        `sinkmech.readers.Reader.ride`): none for a chunk past them; a chunk that is
        not the next of this scan's is refused."""
        return self.hooks(part) if rides(self.batch, self.next_prompt - self.first_prompt, rows, part) else []

    def filled(self, batch: TokenBatch, th: Thresholds, n_bins: int) -> ScanSums:
        """These sums, checked to hold every prompt of `batch` at these settings."""
        if self.th != th or self.n_bins != n_bins:
            raise ValueError("the sums were filled with other thresholds or bins than the scan asks for")
        if not same_prompts(self.batch, batch):
            raise ValueError("the sums were filled over other prompts than the scan's")
        if self.n_prompts != len(batch):
            raise ValueError(f"the sums hold {self.n_prompts} of the scan's {len(batch)} prompts: "
                             "the pass they rode stopped early")
        return self

    def hooks(self, part: TokenBatch) -> list:
        cur: dict[str, Tensor] = {}
        mask = part.mask
        valid_q = mask.clone()
        valid_q[:, 0] = False
        self.pos_total[: mask.shape[1]] += valid_q.sum(0)
        prompt_ids = torch.arange(self.next_prompt, self.next_prompt + len(part), device=part.tokens.device)
        self.n_prompts += len(part)
        self.next_prompt += len(part)
        self.triggers.add_tokens(part.tokens, valid_q, prompt_ids)

        def keep(name):
            def hook(x, hook):
                cur[name] = x
            return hook

        def reduce(z, hook):
            self._reduce_layer(hook.layer(), part, valid_q, mask, z, cur, prompt_ids)
            cur.clear()

        q_name, k_name = ("rot_q", "rot_k") if self.rotary else ("q", "k")
        hooks = []
        for l in range(self.model.cfg.n_layers):
            hooks += [(act_name(q_name, l), keep("q")), (act_name(k_name, l), keep("k")),
                      (act_name("v", l), keep("v")), (act_name("pattern", l), keep("pattern")),
                      (act_name("z", l), reduce)]
        return hooks

    def _reduce_layer(self, l, part, valid_q, mask, z, cur, prompt_ids) -> None:
        th, s, bd = self.th, self.sums, self.band
        pattern = cur["pattern"].float()  # [b, h, q, k]
        f = sink_mass(self.model, pattern)  # [b, h, q]: key 0, plus a learned sink's share
        vq = valid_q[:, None, :].float()
        dormant = (f >= th.high) & valid_q[:, None, :]
        active = (f <= th.low) & valid_q[:, None, :]
        dm, am = dormant.double(), active.double()
        fd = f.double() * vq
        for i, k in enumerate(("f", "f2", "f3", "f4"), 1):
            s[k][l] += (fd ** i).sum((0, 2))
        s["n_dormant"][l] += dm.sum((0, 2))
        s["n_active"][l] += am.sum((0, 2))
        bins = (f * self.n_bins).long().clamp(0, self.n_bins - 1)
        H = f.shape[1]
        head = torch.arange(H, device=f.device)[None, :, None].expand_as(bins)
        self.hist[l].view(-1).index_add_(0, (head * self.n_bins + bins).flatten(), vq.expand_as(f).double().flatten())
        P = f.shape[-1]
        self.pos["f"][l, :, :P] += fd.sum(0)
        self.pos["active"][l, :, :P] += am.sum(0)
        # values: norm at the first token, elsewhere, and what each query reads
        vn = expand_kv(self.model, cur["v"]).float().norm(dim=-1)  # [b, k, h]
        rest = mask.clone()
        rest[:, 0] = False
        s["v_first"][l] += vn[:, 0].double().sum(0)
        s["v_rest"][l] += einops.einsum(vn.double(), rest.double(), "b k h, b k -> h")
        read = einops.einsum(pattern, vn, "b h q k, b k h -> b h q").double()
        s["read_active"][l] += (read * am).sum((0, 2))
        s["read_dormant"][l] += (read * dm).sum((0, 2))
        zf = z.float()
        out = einops.einsum(zf, self.gram[l].float(), zf, "b q h d, h d e, b q h e -> b h q").clamp(min=0).sqrt().double()
        s["out_active"][l] += (out * am).sum((0, 2))
        s["out_dormant"][l] += (out * dm).sum((0, 2))
        # q/k bands, and each band's share of the logit to the first / attended key
        q = cur["q"].float()  # [b, q, h, d]
        k = expand_kv(self.model, cur["k"]).float()
        qb, kb = band_norms(self.layout, q).double(), band_norms(self.layout, k).double()  # [b, p, h, c]
        rest_q = valid_q.double()
        bd["q_first"][l] += qb[:, 0].sum(0)
        bd["k_first"][l] += kb[:, 0].sum(0)
        bd["q_rest"][l] += einops.einsum(qb, rest_q, "b p h c, b p -> h c")
        bd["k_rest"][l] += einops.einsum(kb, rest.double(), "b p h c, b p -> h c")
        bd["q_dormant"][l] += einops.einsum(qb, dm, "b p h c, b h p -> h c")
        bd["q_active"][l] += einops.einsum(qb, am, "b p h c, b h p -> h c")
        logit0 = band_products(self.layout, q, k[:, :1]).double() / self.scale[l]
        bd["logit_first_dormant"][l] += einops.einsum(logit0, dm, "b p h c, b h p -> h c")
        bd["logit_first_active"][l] += einops.einsum(logit0, am, "b p h c, b h p -> h c")
        key_index = pattern[..., 1:].argmax(-1) + 1 if P > 1 else torch.zeros_like(f, dtype=torch.long)
        kh = einops.rearrange(k, "b p h d -> b h p d")
        k_att = torch.gather(kh, 2, key_index[..., None].expand(-1, -1, -1, kh.shape[-1]))
        logit_k = band_products(self.layout, einops.rearrange(q, "b p h d -> b h p d"), k_att).double() / self.scale[l]
        bd["logit_key_active"][l] += einops.einsum(logit_k, am, "b h p c, b h p -> h c")
        self.triggers.add_layer(l, part.tokens, active, key_index, prompt_ids)
        rows = (prompt_ids - self.first_prompt).cpu()  # rows of this batch, whatever the global index
        self.recorded = True
        key_level, per, at_cuts = record_queries(f, key_index, out, valid_q, th)
        self.key_level[rows, l, :, :P] = key_level.int().cpu()
        for k, v in per.items():
            self.per_prompt[k][rows, l] = v.cpu()
        for k, v in at_cuts.items():
            self.cut_sums[k][:, l] += v

    def finish(self, th: Thresholds, *, decode: TokenStr, top_triggers: int, max_tokens: int, sweep: bool = True,
               n_boot: int = 200, progress: bool = False) -> HeadScan:
        """Labels, triggers, and (with per-query records: not for summed shards)
        the threshold sweep and the bootstrap; `progress`: a bar over these
        steps (the trigger tests, the prompt-level judging, the bootstrap, each
        cut of the sweep: seconds each on a CPU)."""
        s = {k: v.cpu() for k, v in self.sums.items()}
        n = float(self.pos_total.sum())
        if n == 0:
            raise ValueError("no query positions to scan")
        nd, na = s["n_dormant"], s["n_active"]
        mean = s["f"] / n
        var = (s["f2"] / n - mean ** 2).clamp(min=0)
        m3 = s["f3"] / n - 3 * mean * s["f2"] / n + 2 * mean ** 3
        m4 = s["f4"] / n - 4 * mean * s["f3"] / n + 6 * mean ** 2 * s["f2"] / n - 3 * mean ** 4
        # Raw moments cancel: m4 carries ~1e-15 of float64 rounding, so below a variance of 1e-6 (std 0.001) the
        # kurtosis, and the coefficient with it, is rounding noise (it changed 100-fold with the batch size).
        bimodality = torch.where(var > 1e-6, (m3 ** 2 / var ** 3 + 1) / (m4 / var ** 2).clamp(min=1e-12), float("nan"))
        pos_total = self.pos_total.cpu()
        by_pos = {k: (v.cpu() / pos_total).where(pos_total > 0, torch.tensor(float("nan"), dtype=torch.float64))
                  for k, v in self.pos.items()}
        valid = self.batch.mask.cpu().clone()
        valid[:, 0] = False
        records = (QueryRecords(self.key_level, self.per_prompt, {k: v.cpu() for k, v in self.cut_sums.items()},
                                self.highs, self.lows, (th.high, th.low), self.batch.tokens.cpu(), valid)
                   if self.recorded else None)
        do_boot, do_sweep = n_boot > 0 and records is not None, sweep and records is not None
        bar = tqdm(total=1 + (records is not None) + do_boot + (len(sweep_cuts()) if do_sweep else 0),
                   desc="label heads", unit="step", disable=not progress)
        triggers, best = self.triggers.finalize(decode=decode,
                                                min_count=th.min_count, top_k=top_triggers,
                                                min_prompts=th.min_prompts, min_lift=th.min_lift, alpha=th.alpha)
        bar.update(1)
        if records is not None:  # prompts as the unit; without records (summed shards) the Poisson tail stays
            triggers = judge_by_prompt(triggers, records.tokens, records.valid, records.active(th.low), records.key,
                                       rule=th.trigger_rule(best.numel()),
                                       prompt_ids=torch.arange(self.first_prompt, self.first_prompt + len(records.tokens)))
            bar.update(1)
        div = lambda a, b: (a / b).float()  # noqa: E731  (0/0 -> NaN: that mode never occurred)
        bands = {}
        for k, v in self.band.items():
            denom = {"q_first": self.n_prompts, "k_first": self.n_prompts, "q_rest": n, "k_rest": n}.get(k)
            if denom is None:
                denom = (nd if "dormant" in k else na)[..., None]
            bands[k] = div(v.cpu(), denom)
        kw = dict(
            first_key_attention_excl_q0=mean.float(),
            dormant_fraction=(nd / n).float(),
            active_fraction=(na / n).float(),
            bimodality=bimodality.float(),
            histogram=(self.hist.cpu() / n).float(),
            attention_by_position=by_pos["f"].float(),
            active_by_position=by_pos["active"].float(),
            value_norm_first=div(s["v_first"], self.n_prompts),
            value_norm_rest=div(s["v_rest"], n),
            value_norm_active=div(s["read_active"], na),
            value_norm_dormant=div(s["read_dormant"], nd),
            output_norm_active=div(s["out_active"], na),
            output_norm_dormant=div(s["out_dormant"], nd),
        )
        labels = classify(HeadStats(kw["dormant_fraction"], kw["active_fraction"], kw["output_norm_dormant"],
                                    kw["output_norm_active"]), triggers, best, th, n_queries=int(n))
        L, H = best.shape
        chosen = [[chosen_trigger(triggers[l][h], th.min_lift) for h in range(H)] for l in range(L)]
        trigger_ok = torch.tensor([[c is not None and c.validated for c in row] for row in chosen])
        uncertainty = bootstrap_labels(records, th, labels.modes, trigger_ok, n_boot=n_boot) if do_boot else None
        bar.update(do_boot)
        sweep_rows = tuple(threshold_sweep(records, th, decode=decode, on_cut=lambda: bar.update(1))) if do_sweep else None
        bar.close()
        return HeadScan(
            **kw,
            bands=bands,
            band_labels=tuple(self.layout.labels()),
            band_frequencies=self.layout.frequencies,
            rotary=self.layout.rotary,
            best_lift=best.float(),
            if_else_score=labels.if_else_score,
            modes=labels.modes,
            evidence=labels.evidence,
            triggers=tuple(tuple(tuple(t) for t in row) for row in triggers),
            thresholds=th,
            n_prompts=self.n_prompts,
            n_queries=int(n),
            bos=self.batch.bos,
            max_tokens=max_tokens,
            model_name=self.model.cfg.model_name,
            uncertainty=uncertainty,
            sweep=sweep_rows,
            records=records,
        )
