"""Exact parallel VAE decode (row bands with halo exchange and global GroupNorm statistics) and VAE files."""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "decode": ("compute_dtype", "decode_latent", "decode_latent_band", "decode_to_image_tensor"),
        "bands": ("RowBands", "plan_band_rows"),
        "decoder": ("check_decoder", "decode_band"),
        "file": ("VaeFileInfo", "inspect_vae_file", "load_vae_file"),
    },
)
