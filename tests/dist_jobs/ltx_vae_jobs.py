"""Worker-side jobs for tests/test_family_ltx_video_vae091.py: every rank reads the tiny 0.9.1-style VAE from the
checkpoint file the test wrote (real file, real loading) and decodes its row band of the latent."""

from __future__ import annotations

import torch


def decode_file(ctx, path: str, z: torch.Tensor, seed: int, min_band_rows: int | None = None) -> torch.Tensor | None:
    """decode_to_image_tensor over the "sp" group with ``seed``: the IMAGE on sp rank 0, None elsewhere."""
    from parallel_runtime.vae.decode import decode_to_image_tensor
    from parallel_runtime.vae.file import load_vae_file

    torch.set_num_threads(1)
    key = f"tests.ltx_vae:{path}"
    if key not in ctx.state:
        ctx.state[key] = load_vae_file(path)
    image = decode_to_image_tensor(ctx.state[key], z, ctx.mesh, "sp", min_band_rows=min_band_rows, seed=seed)
    return None if image is None else image.cpu()
