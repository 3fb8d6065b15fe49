"""``python -m parallel_runtime bench vae``: time and peak memory per rank of the exact parallel VAE
decode on 1, 2 and 4 CPU ranks (one thread each) for one large latent."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from ..parallel.config import ParallelConfig
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def timed_decode(ctx: JobContext, vae_dir: str, latent: torch.Tensor) -> dict[str, Any]:
    """Worker side: decode with every rank of the pool; peak RSS growth measured by resetting the
    kernel's high-water mark (/proc/self/clear_refs) just before."""
    from diffusers import AutoencoderKL

    from ..vae.decode import decode_to_image_tensor

    vae = ctx.state.get(("bench_vae", vae_dir))
    if vae is None:
        vae = ctx.state[("bench_vae", vae_dir)] = AutoencoderKL.from_pretrained(vae_dir).eval()
    group = dist.group.WORLD if ctx.world_size > 1 else None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_kib("VmRSS")
    if dist.is_initialized():
        dist.barrier()
    t0 = time.perf_counter()
    with torch.no_grad():
        image = decode_to_image_tensor(vae, latent, ctx.mesh, group, result_rank=0)
    seconds = time.perf_counter() - t0
    peak = (_status_kib("VmHWM") - base) * 1024
    shape = None if image is None else tuple(image.shape)
    return {"seconds": seconds, "peak_bytes": peak, "image_shape": shape}


def run(quick: bool = False) -> dict[str, Any]:
    from ..models.tiny import ensure_tiny_model

    vae_dir = str(ensure_tiny_model("tiny-sd3") / "vae")
    side = 64 if quick else 256
    latent = torch.randn(1, 16, side, side, generator=torch.Generator().manual_seed(0))
    res: dict[str, Any] = {
        "model": "tiny-sd3's VAE decoder (random weights, narrow channels), 16 latent channels",
        "baseline": "1 rank x 1 thread (models 1 GPU against N GPUs)",
        "latent": [16, side, side],
    }
    for n in (1, 2, 4):
        with WorkerPool(f"cpu:{n}", ParallelConfig(ulysses=n), threads_per_worker=1) as pool:
            pool.submit(timed_decode, vae_dir, latent[:, :, :8, :8]).result(600)  # warm
            outs = pool.submit(timed_decode, vae_dir, latent, result_rank="all").result(3600)
        res[f"seconds_{n}"] = max(o["seconds"] for o in outs)
        res[f"peak_bytes_{n}"] = max(o["peak_bytes"] for o in outs)
        res[f"peak_bytes_per_rank_{n}"] = [o["peak_bytes"] for o in outs]
        res["image_shape"] = outs[0]["image_shape"]
    res["speedup_2"] = res["seconds_1"] / res["seconds_2"]
    res["speedup_4"] = res["seconds_1"] / res["seconds_4"]
    res["peak_ratio_2"] = res["peak_bytes_2"] / res["peak_bytes_1"]
    res["peak_ratio_4"] = res["peak_bytes_4"] / res["peak_bytes_1"]
    res["targets"] = {
        "peak_bytes_2_at_most_0.6x_peak_bytes_1": res["peak_ratio_2"] <= 0.6,
        "speedup_2_at_least_1.7": res["speedup_2"] >= 1.7,
    }
    return res
