"""Loading: the seam an analysis may ask of a model (`backend`), the TransformerLens 3.9
(`hooked`) and 4 (`bridge`) loaders, GGUF reading (`gguf`), the converted-model cache
(`cache`) and the packaged model names (`names`, light: no torch).
"""
