"""Worker-side jobs for tests/test_wan_vae.py: every rank loads the Wan VAE file the test wrote (real
files, the real VAE-file loader) and decodes its row band of a video latent with the parallel decode."""

from __future__ import annotations

from typing import Any

import torch


def decode_video(ctx, vae_file: str, z: torch.Tensor, min_band_rows: int | None = None) -> dict[str, Any]:
    """decode_to_image_tensor over "sp": {"image": IMAGE frames on sp rank 0 else None, "sent": {op: bytes}}."""
    from parallel_runtime.vae.decode import decode_to_image_tensor
    from parallel_runtime.vae.file import load_vae_file

    torch.set_num_threads(1)
    key = ("tests.wan_vae", vae_file)
    if key not in ctx.state:
        ctx.state[key] = load_vae_file(vae_file, ctx.device, torch.float32)
    vae = ctx.state[key]
    before = ctx.mesh.stats.snapshot()
    image = decode_to_image_tensor(vae, z, ctx.mesh, "sp", result_rank=0, min_band_rows=min_band_rows)
    sent = {op: n - before.get(op, 0) for op, n in ctx.mesh.stats.snapshot().items() if n - before.get(op, 0)}
    return {"image": None if image is None else image.cpu(), "sent": sent}
