"""Chroma (ChromaTransformer2DModel): Flux.1-schnell's blocks without their modulation weights, T5 only, every
modulation from one distilled-guidance "approximator"."""

ID = "chroma"
CHROMA1 = "chroma1"  # the shipped config (configs/chroma1/): Chroma1-HD / Base / Flash and the v4x / v50 checkpoints
