"""Worker-side jobs for tests/test_family_hunyuan_video_parallel.py: every rank loads the HunyuanVideo VAE (a
ComfyUI-layout file the test wrote, or a diffusers folder's) with the real loaders and decodes its row band of
a video latent with the parallel decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def _vae(ctx, source: str):
    key = ("tests.hunyuan_video_vae", source)
    if key not in ctx.state:
        if Path(source).is_dir():
            from diffusers import AutoencoderKLHunyuanVideo

            vae = AutoencoderKLHunyuanVideo.from_pretrained(Path(source) / "vae", torch_dtype=torch.float32)
        else:
            from parallel_runtime.vae.file import load_vae_file

            vae = load_vae_file(source, ctx.device, torch.float32)
        ctx.state[key] = vae.to(ctx.device).eval()
    return ctx.state[key]


def decode_video(ctx, source: str, z: torch.Tensor, min_band_rows: int | None = None) -> dict[str, Any]:
    """decode_to_image_tensor over "sp": {"image": IMAGE frames on sp rank 0 else None, "sent": {op: bytes}}."""
    from parallel_runtime.vae.decode import decode_to_image_tensor

    torch.set_num_threads(1)
    vae = _vae(ctx, source)
    before = ctx.mesh.stats.snapshot()
    image = decode_to_image_tensor(vae, z, ctx.mesh, "sp", result_rank=0, min_band_rows=min_band_rows)
    sent = {op: n - before.get(op, 0) for op, n in ctx.mesh.stats.snapshot().items() if n - before.get(op, 0)}
    return {"image": None if image is None else image.cpu(), "sent": sent}
