"""``python -m parallel_runtime bench edit``: a Kontext-structure edit (one reference image) on 1 rank and Ulysses 2.

Model (``config``): a wider tiny FLUX.1 dev (random fp32 weights, a real diffusers folder; FLUX.1 Kontext [dev] has
the same tensors). The job: one reference image of the output's size rides in the sequence after the image's tokens,
so the image part of the sequence is twice a plain generation's (``sequence`` counts the tokens). Both pools stay
warm side by side (one CPU rank x 1 thread; Ulysses 2 on two CPU ranks x 1 thread) and the contenders run
interleaved, round after round, in rotating order (tools/measure.py): the edit on 1 rank (the baseline), the edit on
Ulysses 2 (the reference tokens split with the image's), and, for scale, the plain generation on 1 rank. Each figure
is seconds per sampling step of a ``generate`` job (euler, cfg 1), timed on the host; medians with their spread.
``speedup_ulysses2`` = edit on 1 rank / edit on Ulysses 2 (median over median, and the per-round range);
``reference_cost`` = edit / plain, both on 1 rank. PipeFusion 2 (two CPU ranks x 1 thread, default patches, warmup 1)
runs the same edit interleaved with the others in its three ``reference_kv`` modes: the reference tokens once per step
(the default), with every patch (``saving`` = that step time / the default's) and only in the warmup step
(``kept_vs_per_step``); each mode's reference tokens per stage (from the stages' stats) and its relative distance from
the 1-rank result (stale K/V) are reported with them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..checkout import devtools_module
from ..denoise.settings import SamplingSettings
from ..models.base import Conditioning
from ..models.families.flux.comfy_inputs import reference_images
from ..parallel.config import ParallelConfig
from ..runtime.pool import WorkerPool
from ..service.load_job import load_model
from ..service.model_jobs import generate
from .bench_pipefusion import generate_with_stats
from .measure import interleave, ratio
from .report import machine

BASELINE = "edit, 1 rank x 1 thread"
ULYSSES = "edit, ulysses 2 ranks x 1 thread"
PLAIN = "plain (no reference), 1 rank x 1 thread"
PF_PER_STEP = "edit, pipefusion 2 stages x 1 thread, reference K/V once per step"
PF_RECOMPUTED = "edit, pipefusion 2 stages x 1 thread, reference tokens with every patch"
PF_KEPT = "edit, pipefusion 2 stages x 1 thread, reference K/V kept from warmup"
PF_MODES = {PF_PER_STEP: "per_step", PF_RECOMPUTED: "recomputed", PF_KEPT: "kept"}
WARMUP = 1  # PipeFusion's whole-image steps


class _StepTimer:
    """One contender: ``generate`` of one conditioning on one warm pool; returns seconds per step."""

    def __init__(self, pool: WorkerPool, cond: Conditioning, latent: torch.Tensor, steps: int) -> None:
        self.pool, self.cond, self.latent, self.steps = pool, cond, latent, steps
        self.settings = SamplingSettings(seed=1, steps=steps, cfg=1.0, sampler="euler", guidance=2.5)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        self.pool.submit(generate, self.cond, None, self.latent, self.settings, preview=False).result(3600)
        return (time.perf_counter() - t0) / self.steps


class _PipeFusionTimer:
    """One PipeFusion contender: ``generate_with_stats`` with one ``reference_kv`` mode; seconds per step."""

    def __init__(self, pool: WorkerPool, cond: Conditioning, latent: torch.Tensor, steps: int, mode: str) -> None:
        self.pool, self.cond, self.latent, self.steps, self.mode = pool, cond, latent, steps, mode
        self.settings = SamplingSettings(seed=1, steps=steps, cfg=1.0, sampler="euler", guidance=2.5)
        self.last: list[dict[str, Any]] = []

    def __call__(self) -> float:
        t0 = time.perf_counter()
        job = (self.cond, None, self.latent, self.settings, None, WARMUP, True, "step", self.mode)
        self.last = self.pool.submit(generate_with_stats, *job, result_rank="all").result(3600)
        return (time.perf_counter() - t0) / self.steps


def pipefusion_reference_kv(
    times: dict[str, Any], timers: dict[str, _PipeFusionTimer], single: torch.Tensor
) -> dict[str, Any]:
    """The reference-K/V figures: step times per mode, the saving, the reference tokens each stage ran, and each
    mode's distance from the 1-rank result (stale K/V)."""
    stats = {name: [r["stats"] for r in t.last] for name, t in timers.items()}
    error = {name: float((t.last[0]["latent"] - single).norm() / single.norm()) for name, t in timers.items()}
    return {
        "measured": True,
        "patches": stats[PF_PER_STEP][0].patches,
        "warmup_steps": WARMUP,
        "saving": {
            **ratio(times, PF_RECOMPUTED, PF_PER_STEP),
            "meaning": "reference tokens with every patch / once per step (the default): step time ratio",
        },
        "kept_vs_per_step": {
            **ratio(times, PF_PER_STEP, PF_KEPT),
            "meaning": "once per step / kept from the warmup step (not the default: further from one device, README)",
        },
        "speedup_vs_1rank": ratio(times, BASELINE, PF_PER_STEP),
        "reference_tokens_per_stage": {name: [s.reference_tokens for s in st] for name, st in stats.items()},
        "relative_error_vs_1rank": error,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; ``quick`` uses a smaller model and image (a smoke test)."""
    import json

    torch.set_num_threads(1)
    build_tiny_pipeline = devtools_module("tiny", "bench edit").build_tiny_pipeline
    heads, layers, singles = (4, 1, 2) if quick else (8, 2, 4)
    pixels, steps, repeats = (128, 2, 2) if quick else (384, 4, 5)
    with tempfile.TemporaryDirectory(prefix="edit-bench-") as tmp:
        folder = build_tiny_pipeline(
            "tiny-flux", Path(tmp) / "tiny-flux", num_attention_heads=heads, attention_head_dim=64, num_layers=layers,
            num_single_layers=singles,
        )  # fmt: skip
        config = json.loads((folder / "transformer" / "config.json").read_text())
        gen = torch.Generator().manual_seed(0)
        side = pixels // 8
        latent = torch.zeros(1, config["in_channels"] // 4, side, side)
        text_tokens = 16
        text = torch.randn(1, text_tokens, config["joint_attention_dim"], generator=gen)
        pooled = torch.randn(1, config["pooled_projection_dim"], generator=gen)
        refs = reference_images({"reference_latents": [torch.randn(latent.shape, generator=gen)]}, {}, "positive")
        plain, edit = Conditioning(text, pooled), Conditioning(text, pooled, None, refs)
        tokens = (side // 2) ** 2
        config_name = (
            f"tiny-flux widened (FLUX.1 dev / Kontext structure), random fp32 weights: hidden {heads * 64} "
            f"({heads} heads x 64), {layers} double + {singles} single blocks, {pixels}x{pixels} px, one reference "
            f"image of the same size, euler, cfg 1, {steps} steps a job"
        )
        results: dict[str, Any] = {
            "model": config_name,
            "config": f"tiny-flux widened {heads * 64} ({layers}+{singles} blocks), {pixels} px + 1 reference",
            "baseline": f"'{BASELINE}': the same edit job on one CPU rank (so Ulysses 2 ranks x 1 thread models 2 "
            "devices against 1); median of interleaved rounds",
            "sequence": {
                "image_tokens": tokens,
                "reference_tokens": tokens,
                "text_tokens": text_tokens,
                "image_plus_reference_tokens": 2 * tokens,
                "total_tokens": 2 * tokens + text_tokens,
            },
            "method": f"both pools warm side by side; contenders interleaved in rotating order, {repeats} rounds after "
            "1 untimed warm-up round; seconds per sampling step timed on the host",
            "steps_per_job": steps,
            "repeats": repeats,
            "machine": machine(),
        }
        with (
            WorkerPool("cpu:1", ParallelConfig(), threads_per_worker=1) as single,
            WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1) as pair,
            WorkerPool("cpu:2", ParallelConfig(pp=2), threads_per_worker=1) as pipe,
        ):
            for pool in (single, pair, pipe):
                pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            pf_timers = {name: _PipeFusionTimer(pipe, edit, latent, steps, mode) for name, mode in PF_MODES.items()}
            contenders = {
                BASELINE: _StepTimer(single, edit, latent, steps),
                ULYSSES: _StepTimer(pair, edit, latent, steps),
                PLAIN: _StepTimer(single, plain, latent, steps),
                **pf_timers,
            }
            times = interleave(contenders, repeats=repeats, warmup=1)
            one = _StepTimer(single, edit, latent, steps)
            single_result = single.submit(generate, edit, None, latent, one.settings, preview=False).result(3600)
    results["seconds_per_step"] = {name: s.summary() for name, s in times.items()}
    results["speedup_ulysses2"] = ratio(times, BASELINE, ULYSSES)
    results["reference_cost"] = {**ratio(times, BASELINE, PLAIN), "meaning": "edit step / plain step, both on 1 rank"}
    results["pipefusion_reference_kv"] = pipefusion_reference_kv(times, pf_timers, single_result)
    return results
