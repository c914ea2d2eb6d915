"""Loading: the seam an analysis may ask of a model (`backend`), what the installed
TransformerLens can do (`capabilities`, light), a model spec resolved once into a
source (`names`, light: no torch), `load_model` (`models`), the TransformerLens 3.9
(`hooked`) and 4 (`bridge`) loaders, GGUF reading (`gguf`) and the converted-model
cache (`cache`).
"""
