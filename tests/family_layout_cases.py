"""Shared by the per-family layout tests: a tiny family's single-device results (the oracle) and the runs of
the same job on two-rank layouts in real worker processes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from pipefusion_cases import mean_diff  # tests/ helper

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.loading import PipelineComponents, load_pipeline_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate
from parallel_runtime.tools.bench_pipefusion import generate_with_stats

LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
}


class FamilyReference:
    """A tiny model's positive/negative conditioning (``conds`` of its components) and its single-device
    results by seed, computed once each."""

    def __init__(
        self,
        name: str,
        size: tuple[int, int],
        steps: int,
        cfg: float,
        conds: Callable[[PipelineComponents], tuple[Conditioning, Conditioning]],
    ):
        self.path = str(ensure_tiny_model(name))
        self.components = load_pipeline_components(self.path, "cpu", torch.float32)
        self.adapter = self.components.adapter()
        self.pos, self.neg = conds(self.components)
        width, height = size
        self.latent = torch.zeros(1, 16, height // 8, width // 8)
        self.steps, self.cfg = steps, cfg
        self.results: dict[int, torch.Tensor] = {}

    def settings(self, seed: int = 7) -> SamplingSettings:
        return SamplingSettings(seed=seed, steps=self.steps, cfg=self.cfg, sampler="euler")

    def result(self, seed: int = 7) -> torch.Tensor:
        if seed not in self.results:
            ms = model_sampling_for(self.adapter)
            args = (self.pos, self.neg, self.latent, self.settings(seed))
            self.results[seed] = denoise_latent(self.adapter, ParallelMesh.single(), ms, *args)
        return self.results[seed]

    def load(self, pool) -> None:
        pool.submit(load_model, self.path, "fp32", "sdpa").result(300)


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return got.shape == expected.shape and (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max())


def layout_result(cpu_pool, reference: FamilyReference, layout: str) -> torch.Tensor:
    """The reference job on ``layout`` (PipeFusion: 3 patches, every step a warmup step: exact)."""
    pool = cpu_pool(LAYOUTS[layout])
    reference.load(pool)
    extra = dict(patches=3, warmup=reference.steps) if layout == "pp2" else {}
    return pool.submit(generate, reference.pos, reference.neg, reference.latent, reference.settings(), **extra).result(
        300
    )


def stale_errors(cpu_pool, reference: FamilyReference, patch_counts: tuple[int, ...]) -> tuple[dict[int, float], float]:
    """PipeFusion 2 after one warmup step: the mean error against the single device as a share of what a seed
    change makes, per patch count; and the same with stale K/V off (each patch sees its own tokens, the most
    patches)."""
    pool = cpu_pool(LAYOUTS["pp2"])
    reference.load(pool)
    yardstick = mean_diff(reference.result(8), reference.result())

    def run(patches: int, stale_kv: bool = True) -> float:
        args = (reference.pos, reference.neg, reference.latent, reference.settings(), patches, 1, stale_kv, "step")
        latent = pool.submit(generate_with_stats, *args, result_rank="all").result(300)[0]["latent"]
        return mean_diff(latent, reference.result()) / yardstick

    return {m: run(m) for m in patch_counts}, run(max(patch_counts), stale_kv=False)
