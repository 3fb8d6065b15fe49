"""Flux.1 (FluxTransformer2DModel): dev (guidance-distilled), schnell and Fill (inpainting, extra input channels)."""

ID = "flux"
DEV, SCHNELL, FILL = "flux-dev", "flux-schnell", "flux-fill"  # shipped configs (configs/<variant>/)
