"""``python -m parallel_runtime bench video``: a Wan-shaped video generation and its VAE decode across
CPU ranks (one thread each).

1. Transformer: a tiny-structure Wan (``tiny-wan`` widened: 8 heads of 64, 4 blocks) on a video latent of
   81 frames (21 latent frames) whose token count is like a real clip's per-rank share, at 1 rank and with
   Ulysses 2 / Ring 2; bytes sent per step next to the formulas Ulysses 4·e·B·S·h·L·(N−1)/N² and Ring
   2·e·B·S·h·L·(N−1)/N (per rank; S = video tokens: Wan's text is cross-attention, not in the sequence).
2. VAE: a Wan 2.1-structure AutoencoderKLWan (base width 32) decoding 3 latent frames (9 video frames) at
   1, 2 and 4 ranks: time and peak resident memory per rank (the row bands are what shrinks it).

Every contender's pool stays warm and they run interleaved, round after round (tools/measure.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from ..checkout import devtools_module
from ..denoise.settings import SamplingSettings
from ..parallel.config import ParallelConfig
from ..runtime.pool import WorkerPool
from ..service.load_job import load_model
from .bench_scaling import encode, timed_generate
from .bench_vae import Decoder, timed_decode
from .measure import interleave, ratio
from .report import machine

HEADS, HEAD_DIM, BLOCKS = 8, 64, 4


class VideoContender:
    """A warm pool with the Wan model loaded; each call runs one timed generation (seconds: slowest rank)."""

    def __init__(self, path: Path, config: ParallelConfig, threads: int, latent: torch.Tensor, steps: int):
        self.pool = WorkerPool(f"cpu:{config.world_size}", config, threads_per_worker=threads)
        self.info = self.pool.submit(load_model, str(path), "fp32", "sdpa").result(600)
        pos = self.pool.submit(encode, "a paper boat drifting down a rainy gutter").result(600)[0]
        self.args = (pos, None, latent, SamplingSettings(seed=0, steps=steps, cfg=1.0))
        self.sent: dict[str, int] = {}

    def __call__(self) -> float:
        outs = self.pool.submit(timed_generate, *self.args, result_rank="all").result(3600)
        self.sent = outs[0]["sent"]
        return max(o["seconds"] for o in outs)

    def close(self) -> None:
        self.pool.close()


def _vae_folder(root: Path) -> str:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    folder = root / "wan-vae-32"
    AutoencoderKLWan(base_dim=32, z_dim=16).eval().save_pretrained(folder)
    return str(folder)


def timed_wan_decode(ctx, vae_dir: str, latent: torch.Tensor) -> dict[str, Any]:
    """Worker side: the Wan VAE (diffusers folder) in the job state, then the shared timed decode."""
    from diffusers import AutoencoderKLWan

    key = ("bench_vae", vae_dir)
    if key not in ctx.state:
        ctx.state[key] = AutoencoderKLWan.from_pretrained(vae_dir).eval()
    return timed_decode(ctx, vae_dir, latent)


class VideoDecoder(Decoder):
    """bench_vae's warm decoder with the Wan VAE (a 3-frame slice warms it)."""

    def __init__(self, ranks: int, threads: int, vae_dir: str, latent: torch.Tensor):
        self.pool = WorkerPool(f"cpu:{ranks}", ParallelConfig(ulysses=ranks), threads_per_worker=threads)
        self.vae_dir, self.latent = vae_dir, latent
        self.pool.submit(timed_wan_decode, vae_dir, latent[:, :, :1, :8, :8]).result(600)
        self.peaks: list[list[int]] = []
        self.image_shape = None

    def __call__(self) -> float:
        outs = self.pool.submit(timed_wan_decode, self.vae_dir, self.latent, result_rank="all").result(3600)
        self.peaks.append([o["peak_bytes"] for o in outs])
        self.image_shape = outs[0]["image_shape"]
        return max(o["seconds"] for o in outs)


def _run_all(contenders: dict[str, Any], repeats: int):
    try:
        return interleave(contenders, repeats=repeats, warmup=1)
    finally:
        for c in contenders.values():
            c.close()


def run(quick: bool = False) -> dict[str, Any]:
    build_tiny_pipeline = devtools_module("tiny", "bench video").build_tiny_pipeline

    torch.set_num_threads(1)
    frames, rows, cols = (5, 12, 16) if quick else (21, 12, 16)  # latent frames x token rows x token cols
    steps, repeats = (1, 1) if quick else (1, 3)
    latent = torch.zeros(1, 16, frames, rows * 2, cols * 2)
    tokens = frames * rows * cols
    side = 16 if quick else 32
    z = torch.randn(1, 16, 3, side, side, generator=torch.Generator().manual_seed(0))
    res: dict[str, Any] = {
        "model": f"Wan-layout transformer (tiny-wan widened, random fp32 weights): {HEADS} heads x {HEAD_DIM}, "
        f"{BLOCKS} blocks, UMT5 text as cross-attention; {4 * (frames - 1) + 1} frames = {frames} latent frames x "
        f"{rows} x {cols} tokens = {tokens} tokens. VAE: AutoencoderKLWan base width 32 (Wan 2.1 structure), latent "
        f"{list(z.shape[1:])} -> {4 * 3 - 3} frames of {8 * side}x{8 * side} px",
        "baseline": "1 rank x 1 thread (so 2 ranks x 1 thread models 2 GPUs against 1); 1 rank x 2 threads is what a "
        "CPU user would compare with; 4 ranks share 2 cores (VAE memory per rank only). Speedups: median of "
        "interleaved rounds, with the per-round range",
        "machine": machine(),
        "frames": 4 * (frames - 1) + 1,
        "latent": list(latent.shape[1:]),
        "tokens": tokens,
        "steps_per_run": steps,
        "rounds": repeats,
    }
    with tempfile.TemporaryDirectory(prefix="dit-bench-video-") as tmp:
        root = Path(tmp)
        wan = build_tiny_pipeline(
            "tiny-wan", root / "tiny-wan", num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, num_layers=BLOCKS,
            ffn_dim=4 * HEADS * HEAD_DIM,
        )  # fmt: skip
        specs = {
            "1 rank x 1 thread": (ParallelConfig(), 1),
            "1 rank x 2 threads": (ParallelConfig(), 2),
            "ulysses 2 ranks x 1 thread": (ParallelConfig(ulysses=2), 1),
            "ring 2 ranks x 1 thread": (ParallelConfig(ring=2), 1),
        }
        contenders = {
            name: VideoContender(wan, config, threads, latent, steps) for name, (config, threads) in specs.items()
        }
        times = _run_all(contenders, repeats)
        vae_dir = _vae_folder(root)
        vae_specs = {"1 rank x 1 thread": (1, 1), "2 ranks x 1 thread": (2, 1), "4 ranks x 1 thread": (4, 1)}
        decoders = {name: VideoDecoder(ranks, threads, vae_dir, z) for name, (ranks, threads) in vae_specs.items()}
        vae_times = _run_all(decoders, repeats)
    res["seconds"] = {name: t.summary() for name, t in times.items()}
    res["speedup"] = {
        f"{kind}2_vs_{base.replace(' ', '_')}": ratio(times, base, f"{kind} 2 ranks x 1 thread")
        for kind in ("ulysses", "ring")
        for base in ("1 rank x 1 thread", "1 rank x 2 threads")
    }
    res["speedup_ulysses2"] = res["speedup"]["ulysses2_vs_1_rank_x_1_thread"]["median"]
    res["speedup_ring2"] = res["speedup"]["ring2_vs_1_rank_x_1_thread"]["median"]
    e, b, n, h, layers = 4, 1, 2, HEADS * HEAD_DIM, contenders["1 rank x 1 thread"].info["num_blocks"]
    uly, ring = contenders["ulysses 2 ranks x 1 thread"].sent, contenders["ring 2 ranks x 1 thread"].sent
    res.update(
        {
            "bytes_per_step_ulysses2": uly.get("ulysses", 0) / steps,
            "formula_bytes_ulysses2": 4 * e * b * tokens * h * layers * (n - 1) / n**2,
            "bytes_per_step_ring2": ring.get("ring", 0) / steps,
            "formula_bytes_ring2": 2 * e * b * tokens * h * layers * (n - 1) / n,
        }
    )
    res["vae_image_shape"] = decoders["1 rank x 1 thread"].image_shape
    res["vae_seconds"] = {name: t.summary() for name, t in vae_times.items()}
    for ranks in (1, 2, 4):
        name = f"{ranks} rank{'s' if ranks > 1 else ''} x 1 thread"
        res[f"vae_seconds_{ranks}"] = vae_times[name].median
        res[f"vae_peak_bytes_{ranks}"] = max(max(p) for p in decoders[name].peaks)
    res["vae_speedup_2"] = ratio(vae_times, "1 rank x 1 thread", "2 ranks x 1 thread")["median"]
    res["vae_peak_ratio_2"] = res["vae_peak_bytes_2"] / res["vae_peak_bytes_1"]
    res["vae_peak_ratio_4"] = res["vae_peak_bytes_4"] / res["vae_peak_bytes_1"]
    res["bytes_ratio_ulysses2"] = res["bytes_per_step_ulysses2"] / res["formula_bytes_ulysses2"]
    res["bytes_ratio_ring2"] = res["bytes_per_step_ring2"] / res["formula_bytes_ring2"]
    res["targets"] = {
        "speedup_ulysses2_at_least_1.8": res["speedup_ulysses2"] >= 1.8,
        "speedup_ring2_at_least_1.8": res["speedup_ring2"] >= 1.8,
        "ulysses_bytes_within_5pct": abs(res["bytes_ratio_ulysses2"] - 1) <= 0.05,
        "ring_bytes_within_5pct": abs(res["bytes_ratio_ring2"] - 1) <= 0.05,
        "vae_peak_2_at_most_0.6x_1": res["vae_peak_ratio_2"] <= 0.6,
    }
    return res
