"""Interventions between and within the `<bos>` / no-`<bos>` runs: the batched
sweep engine, metrics, activation patching, per-head ablations and their
attribution estimate (Barbero et al. 2025, Sec. 3)."""
