"""FLUX.2 (Flux2Transformer2DModel): dev, with the Mistral-Small-3.1 text encoder."""

ID = "flux2"
DEV = "flux2-dev"  # the shipped config (configs/flux2-dev/)
