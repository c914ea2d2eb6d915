"""Sharding: the part format, its checksums, the merge and the registry of part
kinds (`parts`, arrays in `arrays`), and runs on a Ray cluster (`ray`). Each
analysis keeps its own adapters (result -> part -> result) next to its result.
"""
