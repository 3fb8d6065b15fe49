"""``python -m parallel_runtime bench pipefusion``: PipeFusion on CPU ranks against one rank.

A tiny-but-deep PixArt (random weights, real files) at >= 4096 image tokens runs the same
generation on one rank (the ordinary engine) and on a pp=2 pipeline (one thread per rank) for
patches M in {2, 4, 8} and warmup in {1, 2}. Reported per setting: wall time and speedup,
activation bytes per step across the stage boundary next to the formula e*B*S*h (element size,
forward batch, image tokens, hidden size), the latent bytes sent back per step, PSNR of the final
latent against the single-rank result; and the weight bytes each rank loaded. PixArt's text is
cross-attention K/V, which travels once per generation (setup), so only image tokens and the
small conditioning vectors cross the boundary per item.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..denoise.settings import SamplingSettings, model_sampling_for
from ..models.base import Conditioning
from ..parallel.config import ParallelConfig
from ..runtime.jobs import JobContext
from ..runtime.pool import WorkerPool
from ..service.load_job import load_model, loaded_model
from ..service.model_jobs import generate


def generate_with_stats(
    ctx: JobContext,
    positive: Conditioning,
    negative: Conditioning | None,
    latent: torch.Tensor,
    settings: SamplingSettings,
    width: int,
    height: int,
    patches: int | None = None,
    warmup: int = 1,
    stale_kv: bool = True,
    agree_cancel_every: str = "step",
) -> dict[str, Any]:
    """Worker job: PipeFusion generation on the loaded model; returns this rank's timing and stats
    (and the latent on rank 0). ``stale_kv=False`` and ``agree_cancel_every="slot"`` run the
    baselines of :class:`~parallel_runtime.pipefusion.pipeline.PipeFusionSettings`."""
    from ..pipefusion.pipeline import PipeFusionSettings, run_pipefusion

    model = loaded_model(ctx)
    ms = model_sampling_for(model.adapter, model.components.scheduler_config, width, height)
    ctx.mesh.stats.reset()
    t0 = time.perf_counter()
    out, stats = run_pipefusion(
        model.adapter,
        ctx.mesh,
        model.stages,
        ms,
        positive.to(ctx.device),
        None if negative is None else negative.to(ctx.device),
        latent.to(ctx.device),
        settings,
        PipeFusionSettings(patches, warmup, stale_kv=stale_kv, agree_cancel_every=agree_cancel_every),  # type: ignore[arg-type]
        attention_backend=model.attention,
        check_cancel=ctx.check_cancel,
        message_tag=ctx.job_id,
    )
    return {"seconds": time.perf_counter() - t0, "latent": out, "stats": stats}


def _psnr(got: torch.Tensor, ref: torch.Tensor) -> float:
    mse = (got.float() - ref.float()).pow(2).mean().item()
    peak = (ref.max() - ref.min()).item()
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; ``quick`` uses a smaller model and image (a smoke test, < 2 minutes)."""
    from ..models.loading import load_pipeline_components
    from ..models.text_encoding import encode_prompts
    from ..models.tiny import build_tiny_pipeline

    torch.set_num_threads(1)
    layers, px, steps = (16, 256, 4) if quick else (16, 1024, 20)
    cfg_scale = 4.5
    with tempfile.TemporaryDirectory(prefix="pipefusion-bench-") as tmp:
        path = build_tiny_pipeline("tiny-pixart", Path(tmp) / "deep-pixart", num_layers=layers)
        comps = load_pipeline_components(path, "cpu", torch.float32, parts=("text",))
        pos, neg = encode_prompts(comps, "pixart", "a lighthouse on a cliff at dawn", "blurry")
        tcfg = comps.transformer_config
        hidden = tcfg["num_attention_heads"] * tcfg["attention_head_dim"]
        latent = torch.zeros(1, 4, px // 8, px // 8)
        tokens = (px // 16) ** 2
        settings = SamplingSettings(seed=3, steps=steps, cfg=cfg_scale, sampler="euler", scheduler="normal")
        forward_batch = 2  # cond + uncond batched in one forward
        results: dict[str, Any] = {
            "model": f"tiny-pixart, {layers} blocks, hidden {hidden}, {tcfg['num_attention_heads']} heads",
            "image": f"{px}x{px} px, {tokens} image tokens, {steps} steps, euler, cfg {cfg_scale}",
            "baseline": "the ordinary engine on 1 rank x 1 thread (models 1 GPU against 2)",
            "threads_per_rank": 1,
        }
        with WorkerPool("cpu:1", ParallelConfig(), threads_per_worker=1) as pool:
            info = pool.submit(load_model, str(path), "fp32", "sdpa").result(600)
            short = SamplingSettings(seed=3, steps=1, cfg=cfg_scale)
            pool.submit(generate, pos, neg, latent, short, px, px, preview=False).result(600)
            t0 = time.perf_counter()
            ref = pool.submit(generate, pos, neg, latent, settings, px, px, preview=False).result(3600)
            serial_s = time.perf_counter() - t0
        results["serial_seconds"] = serial_s
        results["serial_weight_bytes"] = info["transformer_bytes"]
        settings_out: dict[str, Any] = {}
        with WorkerPool("cpu:2", ParallelConfig(pp=2), threads_per_worker=1) as pool:
            info = pool.submit(load_model, str(path), "fp32", "sdpa").result(600)
            ranks = info["pipefusion"]["ranks"]
            results["stages"] = info["pipefusion"]["stages"]
            results["weight_bytes_per_rank"] = [r["param_bytes"] for r in ranks]
            results["weight_bytes_breakdown"] = ranks
            pool.submit(generate_with_stats, pos, neg, latent, short, px, px, 2, 1, result_rank="all").result(600)
            for patches in (2, 4, 8):
                for warmup in (1, 2):
                    t0 = time.perf_counter()
                    per_rank = pool.submit(
                        generate_with_stats, pos, neg, latent, settings, px, px, patches, warmup, result_rank="all"
                    ).result(3600)
                    wall = time.perf_counter() - t0
                    sent0, sent1 = per_rank[0]["stats"].sent_bytes, per_rank[1]["stats"].sent_bytes
                    act = sent0.get("pp_act", 0) / steps
                    settings_out[f"M{patches}_warmup{warmup}"] = {
                        "seconds": wall,
                        "speedup": serial_s / wall,
                        "bytes_per_step_boundary": act,
                        "latent_bytes_per_step": sent1.get("pp_latent", 0) / steps,
                        "setup_bytes": sent0.get("pp_setup", 0),
                        "psnr_db": _psnr(per_rank[0]["latent"], ref),
                        "schedule_bubble_fraction": per_rank[0]["stats"].bubble_fraction,
                        "kv_buffer_bytes_per_rank": [r["stats"].kv_buffer_bytes for r in per_rank],
                        "rank_seconds": [r["stats"].seconds for r in per_rank],
                    }
        formula = 4 * forward_batch * tokens * hidden
        results["formula_bytes_boundary"] = formula
        results["formula"] = f"e*B*S*h = 4 * {forward_batch} * {tokens} * {hidden} (fp32, cond+uncond batch)"
        results["bytes_per_step_boundary"] = {k: v["bytes_per_step_boundary"] for k, v in settings_out.items()}
        results["bytes_vs_formula"] = {k: v["bytes_per_step_boundary"] / formula for k, v in settings_out.items()}
        results["settings"] = settings_out
        results["speedup"] = {k: v["speedup"] for k, v in settings_out.items()}
        results["psnr_db"] = {k: v["psnr_db"] for k, v in settings_out.items()}
        results["speedup_pp2_best"] = max(v["speedup"] for v in settings_out.values())
        results["best_setting"] = max(settings_out, key=lambda k: settings_out[k]["speedup"])
    return results
