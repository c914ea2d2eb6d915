"""Measures beside the sink score: the per-pattern definitions (`definitions`), head
attention (`attention`), value-weighted sinks (`value_weighted`), secondary sinks
(`key_sinks`), massive activations (`massive`), and the shard parts of the sink
scores and of these (`parts`).
"""
