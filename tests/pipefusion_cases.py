"""Shared by the PipeFusion tests: single-device reference results and generation helpers."""

from __future__ import annotations

import dataclasses

import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate
from parallel_runtime.tools.bench_pipefusion import generate_with_stats

# 208 x 336 px: a 26 x 42 latent, 13 x 21 tokens: odd token rows, 3 patches (not a multiple of pp).
WIDTH, HEIGHT = 336, 208
STEPS = 3
# Stale K/V after warmup: the error against the single device, as a share of the difference two
# seeds make, stays under this; each patch attending only to its own tokens is several times worse.
STALE_BOUND = 0.005
STALE_VS_PATCH_LOCAL = 5.0


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """float32 agreement: 1e-4 absolute, scaled by the magnitude when values are large."""
    return (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


def mean_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().mean().item()


class Reference:
    """Single-device (in-process) results, computed once per case."""

    def __init__(self):
        self.cache, self.components = {}, {}

    def components_for(self, name):
        if name not in self.components:
            self.components[name] = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)
        return self.components[name]

    def conds(self, name):
        comps = self.components_for(name)
        return encode_prompts(comps, comps.family, "a tiny house on a hill", "low quality")

    def case(self, name, cfg=None, steps=STEPS, sampler="euler", seed=7):
        cfg = (1.0 if name == "tiny-flux" else 4.0) if cfg is None else cfg
        key = (name, cfg, steps, sampler, seed)
        if key not in self.cache:
            comps = self.components_for(name)
            pos, neg = self.conds(name)
            adapter = comps.adapter()
            latent = torch.zeros(1, adapter.plan.latent_channels, HEIGHT // 8, WIDTH // 8)
            settings = SamplingSettings(seed=seed, steps=steps, cfg=cfg, sampler=sampler, guidance=3.5)
            ms = model_sampling_for(adapter)
            out = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings)
            self.cache[key] = (pos, neg, latent, settings, out)
        return self.cache[key]

    def seed_difference(self, name, cfg=None, steps=STEPS, sampler="euler") -> float:
        """How much the result moves when only the seed changes (7 -> 8): the yardstick for stale K/V."""
        return mean_diff(self.case(name, cfg, steps, sampler, seed=8)[4], self.case(name, cfg, steps, sampler)[4])


def load(pool, name_or_path, **kwargs):
    path = name_or_path if not isinstance(name_or_path, str) else ensure_tiny_model(name_or_path)
    return pool.submit(load_model, str(path), "fp32", "sdpa", **kwargs).result(300)


def run_generate(pool, case, patches=3, warmup=STEPS, events=None, **overrides):
    pos, neg, latent, settings, _ = case
    if overrides:
        settings = dataclasses.replace(settings, **overrides)
    on_event = None if events is None else (lambda *e: events.append(e))
    fut = pool.submit(generate, pos, neg, latent, settings, patches=patches, warmup=warmup, on_event=on_event)
    return fut.result(300)


def run_stats(pool, case, patches, warmup, stale_kv=True, agree_cancel_every="step"):
    """PipeFusion through the benchmark's job: (latent, per-rank stats)."""
    pos, neg, latent, settings, _ = case
    per_rank = pool.submit(
        generate_with_stats,
        pos,
        neg,
        latent,
        settings,
        patches,
        warmup,
        stale_kv,
        agree_cancel_every,
        result_rank="all",
    ).result(300)
    return per_rank[0]["latent"], [r["stats"] for r in per_rank]
