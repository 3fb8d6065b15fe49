"""Compiled blocks (the loader's compile = blocks): equal to the eager blocks, and compiled once per shape.

Oracles: the eager run of the same model (fp32 tolerance) and torch's own compile counters (no graph is
compiled again for another seed or prompt of the same shape). On one rank (attention inside the compiled
graph), Ulysses 2 (attention routed to sequence parallelism from compiled code) and PipeFusion 2 (each
attention module routed to its own stale-K/V buffer).
"""

from __future__ import annotations

import functools

import torch

from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.builtin import builtin_model_path
from parallel_runtime.models.compiled_blocks import compile_counters, set_compiled_blocks
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate
from tests.dist_jobs.cache_jobs import compile_report

MODEL = "tiny-flux-shapes"
PROMPTS = ("a red circle on a blue background", "a green square on a yellow background", "a blue triangle")
SEEDS = range(2)  # the first seed and another: a recompile for a new seed would show at the second
LATENT = torch.zeros(1, 16, 16, 16)  # 128 px, the model's native size
TOLERANCE = 1e-5  # relative, fp32


@functools.cache
def components():
    return load_pipeline_components(builtin_model_path(MODEL), "cpu", torch.float32)


@functools.cache
def conditioning(prompt: str):
    return encode_prompts(components(), "flux", prompt, "")


def settings(seed: int = 0, steps: int = 3) -> SamplingSettings:
    return SamplingSettings(seed=seed, steps=steps, cfg=2.0)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_one_rank_compiled_equals_eager_and_compiles_once():
    comps = components()
    adapter, mesh = comps.adapter(), ParallelMesh.single()
    ms = model_sampling_for(adapter, None)

    def run(seed: int = 0, prompt: str = PROMPTS[0]) -> torch.Tensor:
        return denoise_latent(adapter, mesh, ms, *conditioning(prompt), LATENT, settings(seed))

    eager = run()
    set_compiled_blocks(adapter, "blocks")
    try:
        compiled = run()
        after_first = compile_counters()
        for seed in SEEDS:
            for prompt in PROMPTS:
                run(seed, prompt)
        assert compile_counters() == after_first  # no recompile for another seed or prompt
    finally:
        set_compiled_blocks(adapter, "off")
    assert relative(compiled, eager) <= TOLERANCE
    assert torch.equal(run(), eager)  # "off" is the eager model again


def _check_pool(cpu_pool, config: ParallelConfig, **load) -> None:
    pool = cpu_pool(config)
    path = str(builtin_model_path(MODEL))
    pool.submit(load_model, path, "fp32", "sdpa", **load).result(300)
    eager = pool.submit(generate, *conditioning(PROMPTS[0]), LATENT, settings()).result(300)
    info = pool.submit(load_model, path, "fp32", "sdpa", compile="blocks", **load).result(300)
    assert info["compile"] == "blocks"
    try:
        compiled = pool.submit(generate, *conditioning(PROMPTS[0]), LATENT, settings()).result(1200)
        after_first = pool.submit(compile_report, result_rank="all").result(60)
        for seed in SEEDS:
            for prompt in PROMPTS:
                pool.submit(generate, *conditioning(prompt), LATENT, settings(seed, steps=1)).result(300)
        assert pool.submit(compile_report, result_rank="all").result(60) == after_first
    finally:
        pool.submit(load_model, path, "fp32", "sdpa", **load).result(300)  # eager again for the next tests
    assert relative(compiled, eager) <= TOLERANCE


def test_ulysses_compiled_equals_eager_and_compiles_once(cpu_pool):
    _check_pool(cpu_pool, ParallelConfig(ulysses=2))


def test_pipefusion_compiled_equals_eager_and_compiles_once(cpu_pool):
    _check_pool(cpu_pool, ParallelConfig(pp=2))
