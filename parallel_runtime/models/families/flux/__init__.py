"""Flux.1 (FluxTransformer2DModel): dev (guidance-distilled) and schnell."""

ID = "flux"
DEV, SCHNELL = "flux-dev", "flux-schnell"  # shipped configs (configs/<variant>/)
