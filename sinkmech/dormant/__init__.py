"""Dormant ("if-else") heads (Barbero et al. 2025, Sec. 3.2; Guo et al. 2024):
the streamed scan, its labels, q/k norm bands, triggers, the no-op check, the
scan-then-check recipe (`discover`), contrasts between corpora, and the scan's
shard part (`parts`)."""
