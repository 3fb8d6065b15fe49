"""PipeFusion 2 after one whole-latent warmup step on the video families whose tests had the exact case (every
step a warmup step) but no stale-K/V-off baseline (HunyuanVideo 1.0's stale case: its own 5 % bound against ComfyUI):
HunyuanVideo 1.0, HunyuanVideo 1.5 and LTX-Video 0.9, each on its tiny diffusers folder in real worker processes
(gloo). The error against one device, as a share of what a seed change makes there, stays within the image
families' stale-K/V bound (STALE_BOUND) at 2 and 3 patches, and each patch attending only to its own tokens (stale
K/V off, 3 patches) is several times further off, as tests/test_pipefusion.py asks of the image families. The
patches are bands of latent rows through every frame: a band sees the others' K/V only through the stale buffers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from pipefusion_cases import STALE_BOUND, STALE_VS_PATCH_LOCAL, mean_diff  # tests/ helper

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.tools.bench_pipefusion import generate_with_stats

POSITIVE, NEGATIVE = "a red fox runs through snow, slow motion", "blurry, static"


@dataclass(frozen=True)
class VideoFamily:
    family: str
    name: str
    latent_shape: tuple[int, ...]  # [B, C, T, H, W]: 3 token rows of 5 tokens in 3 frames (45 tokens)
    cfg: float


# Measured stale-K/V errors (2 / 3 patches) as a share of the seed-to-seed difference, and patch-local at 3 patches:
# HunyuanVideo 1.0 0.084% / 0.110%, 1.97% (x18); 1.5 0.039% / 0.054%, 1.00% (x19); LTX-Video 0.051% / 0.062%,
# 1.10% (x18): all within the image families' STALE_BOUND (0.5%).
FAMILIES = {
    "hunyuan-video": VideoFamily("hunyuan-video", "tiny-hunyuan-video", (1, 16, 3, 6, 10), 4.0),
    "hunyuan-video-1.5": VideoFamily("hunyuan-video-1.5", "tiny-hunyuan-video-1.5", (1, 8, 3, 3, 5), 4.0),
    "ltx-video": VideoFamily("ltx-video", "tiny-ltx-video", (1, 128, 3, 3, 5), 3.0),
}


def conditioning(comps, family: str) -> tuple[Conditioning, Conditioning]:
    pos, neg = encode_prompts(comps, family, POSITIVE, NEGATIVE)
    if family != "ltx-video":
        return pos, neg
    from parallel_runtime.models.families.ltx_video.conditioning import LTXFrameRate

    rate = LTXFrameRate(torch.tensor([24.0]))  # what LTXVConditioning adds (24 fps)
    return tuple(Conditioning(c.prompt_embeds, None, c.attention_mask, rate) for c in (pos, neg))


class Case:
    """A family's conditioning, zero latent and single-device results for seeds 7 and 8 (3 euler steps)."""

    def __init__(self, spec: VideoFamily):
        self.spec = spec
        self.path = str(ensure_tiny_model(spec.name))
        comps = load_pipeline_components(self.path, "cpu", torch.float32)
        adapter = comps.adapter()
        self.pos, self.neg = conditioning(comps, spec.family)
        self.latent = torch.zeros(spec.latent_shape)
        ms, mesh = model_sampling_for(adapter), ParallelMesh.single()
        self.expected, other = (
            denoise_latent(adapter, mesh, ms, self.pos, self.neg, self.latent, self.settings(seed)) for seed in (7, 8)
        )
        self.yardstick = mean_diff(other, self.expected)

    def settings(self, seed: int = 7) -> SamplingSettings:
        return SamplingSettings(seed=seed, steps=3, cfg=self.spec.cfg, sampler="euler", scheduler="simple")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_pipefusion_after_warmup_stays_within_the_stale_bound(cpu_pool, family):
    """Warmup 1 of 3 steps: within STALE_BOUND at 2 and 3 patches, and several times closer than each patch
    attending only to its own tokens (stale K/V off, 3 patches)."""
    case = Case(FAMILIES[family])
    pool = cpu_pool(ParallelConfig(pp=2))
    pool.submit(load_model, case.path, "fp32", "sdpa").result(300)

    def error(patches: int, stale_kv: bool = True) -> float:
        args = (case.pos, case.neg, case.latent, case.settings(), patches, 1, stale_kv, "step")
        latent = pool.submit(generate_with_stats, *args, result_rank="all").result(600)[0]["latent"]
        return mean_diff(latent, case.expected) / case.yardstick

    stale = {m: error(m) for m in (2, 3)}
    local = error(3, stale_kv=False)
    assert all(0 < e < STALE_BOUND for e in stale.values()), stale
    assert local > STALE_VS_PATCH_LOCAL * stale[3], (stale, local)
