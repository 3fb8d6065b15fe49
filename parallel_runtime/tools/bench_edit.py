"""``python -m parallel_runtime bench edit``: a Kontext-structure edit (one reference image) on 1 rank and Ulysses 2.

Model: a wider tiny FLUX.1 dev (random fp32 weights, a real diffusers folder; FLUX.1 Kontext [dev] has the same
tensors). The job: one reference image of the output's size rides in the sequence after the image's tokens, so the
image part of the sequence is twice a plain generation's. Each figure is the median seconds per sampling step of
``generate`` jobs on a warm pool (euler, cfg 1), timed on the host over a few steps: the edit on one CPU rank (the
baseline), the edit with Ulysses 2 on two CPU ranks (the reference tokens split with the image's), and, for scale,
the plain generation on one rank. ``speedup`` = 1 rank / Ulysses 2. PipeFusion's kept reference K/V: not measured,
reference images are refused under PipeFusion (README "Not supported yet").
"""

from __future__ import annotations

import statistics
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


def _step_seconds(pool: WorkerPool, cond: Conditioning, latent: torch.Tensor, steps: int, repeats: int) -> list[float]:
    settings = SamplingSettings(seed=1, steps=steps, cfg=1.0, sampler="euler", guidance=2.5)
    pool.submit(generate, cond, None, latent, SamplingSettings(seed=1, steps=1, cfg=1.0, sampler="euler")).result(600)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pool.submit(generate, cond, None, latent, settings, preview=False).result(3600)
        out.append((time.perf_counter() - t0) / steps)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; ``quick`` uses a smaller model and image (a smoke test)."""
    import json

    build_tiny_pipeline = devtools_module("tiny", "bench edit").build_tiny_pipeline
    heads, layers, singles = (4, 1, 2) if quick else (8, 2, 4)
    pixels, steps, repeats = (128, 1, 1) if quick else (384, 2, 3)
    with tempfile.TemporaryDirectory(prefix="edit-bench-") as tmp:
        folder = build_tiny_pipeline(
            "tiny-flux", Path(tmp) / "tiny-flux", num_attention_heads=heads, attention_head_dim=64, num_layers=layers,
            num_single_layers=singles,
        )  # fmt: skip
        config = json.loads((folder / "transformer" / "config.json").read_text())
        gen = torch.Generator().manual_seed(0)
        side = pixels // 8
        latent = torch.zeros(1, config["in_channels"] // 4, side, side)
        text = torch.randn(1, 16, config["joint_attention_dim"], generator=gen)
        pooled = torch.randn(1, config["pooled_projection_dim"], generator=gen)
        refs = reference_images({"reference_latents": [torch.randn(latent.shape, generator=gen)]}, {}, "positive")
        plain, edit = Conditioning(text, pooled), Conditioning(text, pooled, None, refs)
        tokens = (side // 2) ** 2
        results: dict[str, Any] = {
            "model": f"tiny FLUX.1 dev structure (Kontext's tensors), random fp32 weights: hidden {heads * 64} "
            f"({heads} heads x 64), {layers} double + {singles} single blocks",
            "baseline": "edit_1rank_step_s: the same edit job on one CPU rank",
            "image": f"{pixels}x{pixels} px: {tokens} image tokens + {tokens} reference tokens + 16 text tokens",
            "steps_per_job": steps,
            "repeats": repeats,
        }
        timings: dict[str, list[float]] = {}
        with WorkerPool("cpu:1", ParallelConfig(), threads_per_worker=1) as pool:
            pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            timings["edit_1rank"] = _step_seconds(pool, edit, latent, steps, repeats)
            timings["plain_1rank"] = _step_seconds(pool, plain, latent, steps, repeats)
        with WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1) as pool:
            pool.submit(load_model, str(folder), "fp32", "sdpa").result(600)
            timings["edit_ulysses2"] = _step_seconds(pool, edit, latent, steps, repeats)
    for name, values in timings.items():
        results[f"{name}_step_s"] = statistics.median(values)
        results[f"{name}_samples_s"] = values
    results["speedup"] = results["edit_1rank_step_s"] / results["edit_ulysses2_step_s"]
    results["reference_cost"] = results["edit_1rank_step_s"] / results["plain_1rank_step_s"]
    results["pipefusion_kept_reference_kv"] = "not measured: reference images are refused under PipeFusion"
    return results
