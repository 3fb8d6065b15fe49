"""``python -m parallel_runtime bench vae``: the exact parallel VAE decode on CPU ranks.

Model: an AutoencoderKL with the real SD3 / Flux VAE layout (block widths 128/256/512/512, 2
resnets per level, 16 latent channels, GroupNorm 32, no quant convs; ~84M parameters) with random
weights saved as a real diffusers folder, decoding a 32 x 32 latent to 256 x 256 px (``--quick``:
16 x 16 -> 128 x 128), the size this 2-core machine decodes in seconds at full width.

Contenders (pools warm, interleaved, median and spread of N rounds): 1 rank x 1 thread (the
baseline: 2 ranks x 1 thread against it models 2 GPUs against 1), 1 rank x 2 threads (what a CPU
user compares with), 2 ranks x 1 thread, and 4 ranks x 1 thread (on 2 cores only its memory per
rank means anything). Peak memory per rank is the growth of the process's resident high-water
mark during one decode.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..parallel.config import ParallelConfig
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool
from .measure import interleave, ratio
from .report import machine

REAL_VAE: dict[str, Any] = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    block_out_channels=(128, 256, 512, 512),
    layers_per_block=2,
    norm_num_groups=32,
    latent_channels=16,
    sample_size=1024,
    scaling_factor=0.3611,
    shift_factor=0.1159,
    use_quant_conv=False,
    use_post_quant_conv=False,
)


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


def write_real_vae(dest: Path) -> int:
    """The real-width VAE with random weights, saved as a diffusers folder; returns the decoder's parameter count."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(**REAL_VAE).eval()
    vae.save_pretrained(dest)
    return sum(p.numel() for p in vae.decoder.parameters())


class Decoder:
    """A warm pool holding the VAE; each call decodes the latent once (seconds: slowest rank)."""

    def __init__(self, ranks: int, threads: int, vae_dir: str, latent: torch.Tensor):
        self.pool = WorkerPool(f"cpu:{ranks}", ParallelConfig(ulysses=ranks), threads_per_worker=threads)
        self.vae_dir, self.latent = vae_dir, latent
        self.pool.submit(timed_decode, vae_dir, latent[:, :, :8, :8]).result(600)  # load and warm
        self.peaks: list[list[int]] = []
        self.image_shape = None

    def __call__(self) -> float:
        outs = self.pool.submit(timed_decode, self.vae_dir, self.latent, result_rank="all").result(3600)
        self.peaks.append([o["peak_bytes"] for o in outs])
        self.image_shape = outs[0]["image_shape"]
        return max(o["seconds"] for o in outs)

    def close(self) -> None:
        self.pool.close()


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    side, repeats = (16, 2) if quick else (32, 3)
    latent = torch.randn(1, 16, side, side, generator=torch.Generator().manual_seed(0))
    widths = "/".join(str(w) for w in REAL_VAE["block_out_channels"])
    res: dict[str, Any] = {
        "model": f"AutoencoderKL decoder in the SD3/Flux layout (widths {widths}, 2 resnets per level, 16 latent "
        f"channels, GroupNorm 32), random fp32 weights; latent 16x{side}x{side} -> {8 * side}x{8 * side} px",
        "baseline": "1 rank x 1 thread (so 2 ranks x 1 thread models 2 GPUs against 1); 1 rank x 2 threads is what a "
        "CPU user would compare with; 4 ranks share 2 cores (memory per rank only)",
        "machine": machine(),
        "latent": [16, side, side],
        "rounds": repeats,
    }
    specs = {
        "1 rank x 1 thread": (1, 1),
        "1 rank x 2 threads": (1, 2),
        "2 ranks x 1 thread": (2, 1),
        "4 ranks x 1 thread": (4, 1),
    }
    decoders: dict[str, Decoder] = {}
    with tempfile.TemporaryDirectory(prefix="dit-bench-vae-") as tmp:
        vae_dir = str(Path(tmp) / "vae")
        res["decoder_parameters"] = write_real_vae(Path(vae_dir))
        try:
            for name, (ranks, threads) in specs.items():
                decoders[name] = Decoder(ranks, threads, vae_dir, latent)
            times = interleave(decoders, repeats=repeats, warmup=1)
        finally:
            for d in decoders.values():
                d.close()
    res["image_shape"] = decoders["1 rank x 1 thread"].image_shape
    res["seconds"] = {name: t.summary() for name, t in times.items()}
    res["speedup"] = {
        "2_ranks_vs_1rank_1thread": ratio(times, "1 rank x 1 thread", "2 ranks x 1 thread"),
        "2_ranks_vs_1rank_2threads": ratio(times, "1 rank x 2 threads", "2 ranks x 1 thread"),
        "4_ranks_vs_1rank_1thread": ratio(times, "1 rank x 1 thread", "4 ranks x 1 thread"),
    }
    peak = {name: max(max(p) for p in d.peaks[1:] or d.peaks) for name, d in decoders.items()}
    res["peak_bytes_per_rank"] = peak
    res["peak_ratio_2_ranks"] = peak["2 ranks x 1 thread"] / peak["1 rank x 1 thread"]
    res["peak_ratio_4_ranks"] = peak["4 ranks x 1 thread"] / peak["1 rank x 1 thread"]
    res["targets"] = {
        "peak_per_rank_2_ranks_at_most_0.6x": res["peak_ratio_2_ranks"] <= 0.6,
        "speedup_2_ranks_at_least_1.7": res["speedup"]["2_ranks_vs_1rank_1thread"]["median"] >= 1.7,
    }
    return res
