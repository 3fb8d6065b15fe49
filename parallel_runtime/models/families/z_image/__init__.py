"""Z-Image (ZImageTransformer2DModel): Turbo and base, one single-stream DiT with a Qwen3 text encoder and the
Flux VAE."""

ID = "z-image"
Z_IMAGE_6B = "z-image-6b"  # the shipped config (configs/z-image-6b/): Turbo and base share it
