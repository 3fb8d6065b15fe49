"""PixArt-alpha / sigma (PixArtTransformer2DModel)."""

ID = "pixart"
SIGMA_1024 = "pixart-sigma-1024"  # the shipped config (configs/pixart-sigma-1024/)
