"""A quality floor for the caches on the trained tiny-flux-shapes (28 steps, its native 128 px, cfg 2).

Oracle: the uncached picture of the same seed. The block cache at its defaults keeps the decoded picture
above BLOCK_FLOOR_DB and LazyCache above LAZY_FLOOR_DB (mean PSNR over three prompts), while each still
reuses; the same caches reusing regardless of the measure (a threshold no change reaches) fall below the
floor, so the floor would catch a cache that ignored its threshold.
"""

from __future__ import annotations

import functools

import pytest
import torch

from parallel_runtime.denoise.caching.specs import BlockCacheSpec, StepCacheSpec
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.builtin import builtin_model_path
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.vae.decode import decode_to_image_tensor
from parallel_runtime.vae.latent_space import to_vae_space

PROMPTS = ("a red circle on a blue background", "a green square on a yellow background", "a blue triangle")
STEPS, CFG, SEED = 28, 2.0, 0
BLOCK_FLOOR_DB, LAZY_FLOOR_DB = 40.0, 30.0
CASES = {  # name: (cache at its defaults, the same cache reusing blindly, floor)
    "block": (BlockCacheSpec(), BlockCacheSpec(threshold=10.0), BLOCK_FLOOR_DB),
    "lazycache": (StepCacheSpec("lazycache"), StepCacheSpec("lazycache", reuse_threshold=3.0), LAZY_FLOOR_DB),
}


@functools.cache
def model():
    torch.set_num_threads(1)
    comps = load_pipeline_components(builtin_model_path("tiny-flux-shapes"), "cpu", torch.float32)
    adapter = comps.adapter()
    return comps, adapter, model_sampling_for(adapter, None)


def picture(prompt: str, cache=None) -> tuple[torch.Tensor, int]:
    """(decoded picture in 0..1, model calls the cache answered without the middle blocks / skipped)."""
    comps, adapter, ms = model()
    pos, neg = encode_prompts(comps, "flux", prompt, "")
    kind = {} if cache is None else {"block_cache" if isinstance(cache, BlockCacheSpec) else "step_cache": cache}
    settings = SamplingSettings(seed=SEED, steps=STEPS, cfg=CFG, **kind)
    reports: list[dict] = []
    mesh = ParallelMesh.single()
    raw = denoise_latent(adapter, mesh, ms, pos, neg, torch.zeros(1, 16, 16, 16), settings, cache_report=reports.extend)
    with torch.no_grad():
        image = decode_to_image_tensor(comps.vae, to_vae_space(comps.vae, raw), mesh, None, result_rank=0)
    reused = sum(r.get("skipped", r.get("reused", 0)) for r in reports)
    return image.clamp(0, 1), reused


@functools.cache
def uncached(prompt: str) -> torch.Tensor:
    return picture(prompt)[0]


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * torch.log10(1.0 / (a - b).pow(2).mean().clamp_min(1e-20)))


@pytest.mark.parametrize("name", list(CASES))
def test_cache_keeps_the_picture_above_the_floor_and_blind_reuse_does_not(name):
    cache, blind, floor = CASES[name]
    kept, lost, reused = [], [], []
    for prompt in PROMPTS:
        image, n = picture(prompt, cache)
        kept.append(psnr(image, uncached(prompt)))
        reused.append(n)
        lost.append(psnr(picture(prompt, blind)[0], uncached(prompt)))
    assert min(reused) >= 5, f"{name} must reuse to be worth testing: {reused}"
    assert sum(kept) / len(kept) >= floor, (name, kept)
    assert sum(lost) / len(lost) < floor, (name, lost)  # the floor tells a measuring cache from a blind one
