"""Context windows: loss and sinks past the training length (`length`) and
StreamingLLM windows with their sink tokens (`stream`).
"""
