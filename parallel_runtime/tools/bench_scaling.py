"""``python -m parallel_runtime bench scaling``: Ulysses, Ring and CFG parallelism on 2 CPU ranks.

Models: a Flux-layout transformer (2 double + 2 single blocks, hidden 512 = 8 heads x 64, random
fp32 weights, real diffusers files) at 1024 x 1024 px (4096 image tokens) for Ulysses and Ring,
and an SD3-layout one (4 blocks, same width, cfg 4) for CFG parallelism. Every contender's pool
stays warm and they run interleaved, round after round (median and spread of N rounds):

- "1 rank x 1 thread": the baseline. Against it, "2 ranks x 1 thread" models 1 GPU against 2.
- "1 rank x 2 threads": what a CPU user would compare with (the same two cores, one process).
- "2 ranks x 1 thread" with Ulysses, Ring or CFG.

Bytes per step are counted by the collectives and printed next to the formulas (per rank)
Ulysses 4·e·B·S·h·L·(N−1)/N² and Ring 2·e·B·S·h·L·(N−1)/N.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..checkout import devtools_module
from ..denoise.settings import SamplingSettings
from ..parallel.config import ParallelConfig
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool
from ..service.load_job import load_model
from ..service.model_jobs import encode_text, generate
from .measure import interleave, ratio
from .report import machine


def timed_generate(ctx: JobContext, positive, negative, latent, settings) -> dict[str, Any]:
    """Worker side: one generate call, timed inside the worker, with the bytes this rank sent."""
    ctx.mesh.stats.reset()
    t0 = time.perf_counter()
    generate(ctx, positive, negative, latent, settings, preview=False)
    return {"seconds": time.perf_counter() - t0, "sent": ctx.mesh.stats.snapshot()}


def encode(ctx: JobContext, prompt: str):
    return encode_text(ctx, [prompt])


def family_of_folder(folder: Path) -> str:
    """The family id of a diffusers folder's transformer (the benches label their contenders with it)."""
    import json

    from ..models.families.registry import family_of_class_name

    config = json.loads((folder / "transformer" / "config.json").read_text(encoding="utf-8"))
    return family_of_class_name(config["_class_name"]).id


def _build(name: str, root: Path, **overrides) -> Path:
    build_tiny_pipeline = devtools_module("tiny", "bench scaling").build_tiny_pipeline

    dest = root / name
    if not (dest / "model_index.json").exists():
        build_tiny_pipeline(name.split("@")[0], dest, **overrides)
    return dest


def bench_latent(info: dict[str, Any], px: int, frames: int = 1) -> torch.Tensor:
    """Zeros in the engine's latent shape of the loaded model for a ``px`` x ``px`` picture (a video model:
    ``frames`` latent frames), from what ``load_model`` said about it (the LATENT's frame axis of some image
    models is ComfyUI's, dropped before the engine)."""
    channels, side = info["latent_channels"], px // info["spatial_factor"]
    if info["latent_dims"] == 3:
        return torch.zeros(1, channels, frames, side, side)
    return torch.zeros(1, channels, side, side)


class Contender:
    """A warm pool with the model loaded; each call runs one timed generation (seconds: slowest rank)."""

    def __init__(
        self,
        path: Path,
        config: ParallelConfig,
        threads: int,
        px: int,
        steps: int,
        cfg: float,
        frames: int = 1,
        prompts: tuple[Any, Any] | None = None,
    ):
        """``prompts``: (positive, negative) conditionings for a model whose prompts no worker encodes."""
        self.pool = WorkerPool(f"cpu:{config.world_size}", config, threads_per_worker=threads)
        self.info = self.pool.submit(load_model, str(path), "fp32", "sdpa").result(600)
        if prompts is None:
            pos = self.pool.submit(encode, "a lighthouse on a cliff at dawn").result(600)[0]
            neg = self.pool.submit(encode, "").result(600)[0] if cfg != 1.0 else None
        else:
            pos, neg = prompts[0], prompts[1] if cfg != 1.0 else None
        latent = bench_latent(self.info, px, frames)
        self.text_tokens = pos.prompt_embeds.shape[1]
        self.args = (pos, neg, latent, SamplingSettings(seed=0, steps=steps, cfg=cfg))
        self.sent: dict[str, int] = {}

    def __call__(self) -> float:
        outs = self.pool.submit(timed_generate, *self.args, result_rank="all").result(1800)
        self.sent = outs[0]["sent"]
        return max(o["seconds"] for o in outs)

    def close(self) -> None:
        self.pool.close()


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    px = 512 if quick else 1024  # Flux: (px/16)^2 image tokens -> 1024 or 4096
    steps, repeats = (1, 1) if quick else (1, 3)
    heads, head_dim = 8, 64
    tokens = (px // 16) ** 2
    res: dict[str, Any] = {
        "model": f"Flux-layout transformer (random fp32 weights): 2 double + 2 single blocks, hidden {heads * head_dim} "
        f"({heads} heads x {head_dim}), {px}x{px} px = {tokens} image tokens, 16 latent channels; CFG: SD3-layout, "
        f"4 blocks, same width and tokens, cfg 4",
        "baseline": "1 rank x 1 thread (so 2 ranks x 1 thread models 2 GPUs against 1); 1 rank x 2 threads is what a "
        "CPU user would compare with. Speedups: median of interleaved rounds, with the per-round range",
        "machine": machine(),
        "image_tokens": tokens,
        "hidden": heads * head_dim,
        "steps_per_run": steps,
        "rounds": repeats,
    }
    with tempfile.TemporaryDirectory(prefix="dit-bench-") as tmp:
        root = Path(tmp)
        flux = _build(
            "tiny-flux", root, num_attention_heads=heads, attention_head_dim=head_dim, num_layers=2, num_single_layers=2
        )
        sd3 = _build(
            "tiny-sd3",
            root,
            num_attention_heads=heads,
            attention_head_dim=head_dim,
            num_layers=4,
            patch_size=2,
            pos_embed_max_size=px // 16,
        )
        flux_id, sd3_id = family_of_folder(flux), family_of_folder(sd3)  # the contenders' labels
        specs = {
            f"{flux_id} 1 rank x 1 thread": (flux, ParallelConfig(), 1, 1.0),
            f"{flux_id} 1 rank x 2 threads": (flux, ParallelConfig(), 2, 1.0),
            f"{flux_id} ulysses 2 ranks x 1 thread": (flux, ParallelConfig(ulysses=2), 1, 1.0),
            f"{flux_id} ring 2 ranks x 1 thread": (flux, ParallelConfig(ring=2), 1, 1.0),
            f"{sd3_id} 1 rank x 1 thread": (sd3, ParallelConfig(), 1, 4.0),
            f"{sd3_id} 1 rank x 2 threads": (sd3, ParallelConfig(), 2, 4.0),
            f"{sd3_id} cfg 2 ranks x 1 thread": (sd3, ParallelConfig(cfg=2), 1, 4.0),
        }
        contenders: dict[str, Contender] = {}
        try:
            for name, (path, config, threads, cfg) in specs.items():
                contenders[name] = Contender(path, config, threads, px, steps, cfg)
            times = interleave(contenders, repeats=repeats, warmup=1)
        finally:
            for c in contenders.values():
                c.close()

    res["seconds"] = {name: t.summary() for name, t in times.items()}
    speedups: dict[str, Any] = {}
    for family, parallel in ((flux_id, ("ulysses", "ring")), (sd3_id, ("cfg",))):
        for kind in parallel:
            mine = f"{family} {kind} 2 ranks x 1 thread"
            speedups[f"{kind}2_vs_1rank_1thread"] = ratio(times, f"{family} 1 rank x 1 thread", mine)
            speedups[f"{kind}2_vs_1rank_2threads"] = ratio(times, f"{family} 1 rank x 2 threads", mine)
    res["speedup"] = speedups
    e, b, n = 4, 1, 2
    single = contenders[f"{flux_id} 1 rank x 1 thread"]
    s = tokens + single.text_tokens
    h = heads * head_dim
    layers = single.info["num_blocks"]
    uly = contenders[f"{flux_id} ulysses 2 ranks x 1 thread"].sent
    ring = contenders[f"{flux_id} ring 2 ranks x 1 thread"].sent
    res.update(
        {
            "attention_layers": layers,
            "sequence_tokens": s,
            "bytes_per_step_ulysses2": uly.get("ulysses", 0) / steps,
            "formula_bytes_ulysses2": 4 * e * b * s * h * layers * (n - 1) / n**2,
            "bytes_per_step_ring2": ring.get("ring", 0) / steps,
            "formula_bytes_ring2": 2 * e * b * s * h * layers * (n - 1) / n,
            "bytes_per_step_cfg2": contenders[f"{sd3_id} cfg 2 ranks x 1 thread"].sent.get("cfg", 0) / steps,
            "other_bytes_per_step_ulysses2": {k: v / steps for k, v in uly.items() if k != "ulysses"},
        }
    )
    res["bytes_ratio_ulysses2"] = res["bytes_per_step_ulysses2"] / res["formula_bytes_ulysses2"]
    res["bytes_ratio_ring2"] = res["bytes_per_step_ring2"] / res["formula_bytes_ring2"]
    res["targets"] = {
        **{f"{k}_at_least_1.8": v["median"] >= 1.8 for k, v in speedups.items() if k.endswith("1thread")},
        "ulysses_bytes_within_5pct": abs(res["bytes_ratio_ulysses2"] - 1) <= 0.05,
        "ring_bytes_within_5pct": abs(res["bytes_ratio_ring2"] - 1) <= 0.05,
    }
    return res
