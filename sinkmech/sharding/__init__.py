"""Sharding: the part format and its checksums (`parts`), the merge of each result's
parts (`sinks`, `mechanisms`, `length`) and runs on a Ray cluster (`ray`).
"""
