"""HiDream-I1 on every layout in real worker processes equals our single-device result (itself diffusers' and
ComfyUI's: tests/test_family_hidream.py, test_family_hidream_comfy.py): Ulysses, Ring, CFG parallel, PipeFusion
(exact with warmup = steps; after warmup within the stale-K/V bound, and several times closer than patch-local
attention). The text differs per block (each block appends its Llama layer's tokens): every rank holds its
share of them, positive and negative of different lengths."""

from __future__ import annotations

import pytest
import torch
from pipefusion_cases import STALE_BOUND, STALE_VS_PATCH_LOCAL, mean_diff  # tests/ helpers

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hidream.conditioning import HiDreamText
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate
from parallel_runtime.tools.bench_pipefusion import generate_with_stats

NAME, STEPS = "tiny-hidream", 3
WIDTH, HEIGHT = 208, 176  # 11 x 13 tokens: odd, not a multiple of 2
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
}


def conditioning(t5_tokens: int, llama_tokens: int, seed: int) -> Conditioning:
    """What ComfyUI's HiDream text encoder gives, at the tiny widths (T5 32, pooled 20, 4 Llama layers of 24)."""
    g = torch.Generator().manual_seed(seed)
    llama = torch.randn(1, 4, llama_tokens, 24, generator=g)
    return Conditioning(torch.randn(1, t5_tokens, 32, generator=g), torch.randn(1, 20, generator=g), None,
                        HiDreamText(llama))  # fmt: skip


class Reference:
    """The tiny HiDream's conditioning (positive 7 + 5 tokens, negative 3 + 4) and single-device results by seed."""

    def __init__(self):
        self.path = str(ensure_tiny_model(NAME))
        self.adapter = load_pipeline_components(self.path, "cpu", torch.float32).adapter()
        self.pos, self.neg = conditioning(7, 5, 1), conditioning(3, 4, 2)
        self.latent = torch.zeros(1, 16, HEIGHT // 8, WIDTH // 8)
        self.results: dict[int, torch.Tensor] = {}

    def settings(self, seed: int = 7) -> SamplingSettings:
        return SamplingSettings(seed=seed, steps=STEPS, cfg=5.0, sampler="euler")

    def result(self, seed: int = 7) -> torch.Tensor:
        if seed not in self.results:
            ms = model_sampling_for(self.adapter)
            args = (self.pos, self.neg, self.latent, self.settings(seed))
            self.results[seed] = denoise_latent(self.adapter, ParallelMesh.single(), ms, *args)
        return self.results[seed]

    def load(self, pool) -> None:
        pool.submit(load_model, self.path, "fp32", "sdpa").result(300)


@pytest.fixture(scope="module")
def reference():
    return Reference()


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return got.shape == expected.shape and (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_equals_single_device(cpu_pool, reference, layout):
    pool = cpu_pool(LAYOUTS[layout])
    reference.load(pool)
    extra = dict(patches=3, warmup=STEPS) if layout == "pp2" else {}
    got = pool.submit(generate, reference.pos, reference.neg, reference.latent, reference.settings(), **extra)
    assert close(got.result(300), reference.result())


def test_pipefusion_after_warmup_stays_within_the_stale_bound(cpu_pool, reference):
    """Warmup 1 of 3 steps with 3 and 5 patches: within STALE_BOUND of what a seed change makes, and several
    times closer than each patch attending only to its own tokens (stale K/V off, 5 patches)."""
    pool = cpu_pool(LAYOUTS["pp2"])
    reference.load(pool)
    yardstick = mean_diff(reference.result(8), reference.result())

    def run(patches: int, stale_kv: bool = True) -> float:
        args = (reference.pos, reference.neg, reference.latent, reference.settings(), patches, 1, stale_kv, "step")
        latent = pool.submit(generate_with_stats, *args, result_rank="all").result(300)[0]["latent"]
        return mean_diff(latent, reference.result()) / yardstick

    stale = {m: run(m) for m in (3, 5)}
    assert all(0 < e < STALE_BOUND for e in stale.values()), stale
    local = run(5, stale_kv=False)
    assert local > STALE_VS_PATCH_LOCAL * stale[5], (stale, local)
