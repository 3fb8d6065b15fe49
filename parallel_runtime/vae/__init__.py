"""Exact parallel VAE decode: row bands with halo exchange and global GroupNorm statistics; VAE files."""
