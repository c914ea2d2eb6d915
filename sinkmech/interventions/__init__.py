"""Interventions between and within the `<bos>` / no-`<bos>` runs: the batched
sweep engine, metrics, activation patching, per-head ablations and their
attribution estimate (Barbero et al. 2025, Sec. 3), the perturbation spread of a
one-token swap (`perturb`, with its recipe in `recipes`), and the shard parts of
ablate, patch and perturb (`parts`)."""
