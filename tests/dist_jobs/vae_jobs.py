"""Worker-side jobs for tests/test_vae.py: every rank loads the tiny VAE saved by the test from
disk (real files, real loading), decodes its row band of the latent with the parallel decode,
and returns what it got (the assembled image on the result rank, None elsewhere) together with
the bytes it sent per operation in this job."""

from __future__ import annotations

from typing import Any

import torch


def _load_vae(ctx, vae_dir: str, dtype: torch.dtype):
    """The VAE saved in ``vae_dir``, loaded once per worker (kept in the worker's job state)."""
    from diffusers import AutoencoderKL

    cache = getattr(ctx, "state", None)
    key = ("tests.vae", vae_dir, str(dtype))
    if cache is not None and key in cache:
        return cache[key]
    vae = AutoencoderKL.from_pretrained(vae_dir, torch_dtype=dtype).to(ctx.device).eval()
    if cache is not None:
        cache[key] = vae
    return vae


def _sent_since(ctx, before: dict[str, int]) -> dict[str, int]:
    """Bytes sent per op name since ``before`` (the pool's mesh lives across jobs)."""
    now = ctx.mesh.stats.snapshot()
    return {op: n - before.get(op, 0) for op, n in now.items() if n - before.get(op, 0)}


def decode_band(
    ctx,
    vae_dir: str,
    z: torch.Tensor,
    image_rank: int | str = 0,
    min_band_rows: int | None = None,
    dtype: torch.dtype = torch.float32,
    upcast: bool | None = None,
) -> dict[str, Any]:
    """decode_latent over the "sp" group, assembled on sp rank ``image_rank`` (or "all"):
    {"image": [B,3,H,W] or None, "sent": {op: bytes}}."""
    from parallel_runtime.vae.decode import decode_latent

    torch.set_num_threads(1)
    vae = _load_vae(ctx, vae_dir, dtype)
    before = ctx.mesh.stats.snapshot()
    image = decode_latent(vae, z, ctx.mesh, "sp", result_rank=image_rank, min_band_rows=min_band_rows, upcast=upcast)
    return {"image": None if image is None else image.cpu(), "sent": _sent_since(ctx, before)}


def decode_image(ctx, vae_dir: str, z: torch.Tensor, image_rank: int | str = 0) -> torch.Tensor | None:
    """decode_to_image_tensor over the "sp" group: ComfyUI IMAGE [B,H,W,3] on the result rank."""
    from parallel_runtime.vae.decode import decode_to_image_tensor

    torch.set_num_threads(1)
    vae = _load_vae(ctx, vae_dir, torch.float32)
    image = decode_to_image_tensor(vae, z, ctx.mesh, "sp", result_rank=image_rank)
    return None if image is None else image.cpu()


def decode_mismatched(ctx, vae_dir: str, z: torch.Tensor) -> str:
    """Rank 0 passes a latent one row shorter than the others: every rank must raise (no hang)."""
    from parallel_runtime.errors import ConfigError
    from parallel_runtime.vae.decode import decode_latent

    torch.set_num_threads(1)
    vae = _load_vae(ctx, vae_dir, torch.float32)
    mine = z[:, :, 1:] if ctx.mesh.rank("sp") == 0 else z
    try:
        decode_latent(vae, mine, ctx.mesh, "sp")
    except ConfigError as exc:
        return str(exc)
    return "no error"


def decode_qwen_image(ctx, vae_dir: str, z: torch.Tensor, min_band_rows: int | None = None) -> dict[str, Any]:
    """decode_to_image_tensor of a Qwen-Image VAE (AutoencoderKLQwenImage saved in ``vae_dir``) over "sp":
    {"image": IMAGE on sp rank 0 else None, "sent": {op: bytes}}."""
    from diffusers import AutoencoderKLQwenImage

    from parallel_runtime.vae.decode import decode_to_image_tensor

    torch.set_num_threads(1)
    key = ("tests.qwen_image_vae", vae_dir)
    if key not in ctx.state:
        ctx.state[key] = AutoencoderKLQwenImage.from_pretrained(vae_dir, torch_dtype=torch.float32).eval()
    before = ctx.mesh.stats.snapshot()
    image = decode_to_image_tensor(ctx.state[key], z, ctx.mesh, "sp", result_rank=0, min_band_rows=min_band_rows)
    return {"image": None if image is None else image.cpu(), "sent": _sent_since(ctx, before)}
