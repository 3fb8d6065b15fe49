"""Wan across ranks in real worker processes equals our single-device result (itself equal to diffusers'
and ComfyUI's, tests/test_wan_oracle.py and test_wan_comfy_reference.py): Ulysses, Ring, CFG parallel,
PipeFusion with patches along the video token sequence (warmup covering every step), image-to-video
conditioning, TI2V's per-frame time under sequence parallelism, and the two-expert A14B switch."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.wan.conditioning import WanImageInputs
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, encode_text, generate

LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
    "ulysses2xring2": ParallelConfig(ring=2, ulysses=2),
}
STEPS = 3
# 3 latent frames of 6 x 10: a token grid of (3, 3, 5) = 45 tokens, divisible by neither 2 nor 4
LATENT = (1, 16, 3, 6, 10)


class Case:
    """A tiny Wan model, its conditioning and the single-device (in-process) result."""

    def __init__(
        self,
        name: str,
        extras: dict | None = None,
        mask: torch.Tensor | None = None,
        cfg: float = 4.0,
        size: tuple[int, ...] = LATENT[2:],
    ):
        self.path = str(ensure_tiny_model(name))
        comps = load_pipeline_components(self.path, "cpu", torch.float32)
        adapter = comps.adapter()
        pos, neg = encode_prompts(comps, "wan", "a paper boat drifting down a gutter", "static, blurry")
        extras = WanImageInputs(**extras) if extras else None
        self.pos = Conditioning(pos.prompt_embeds, extras=extras)
        self.neg = Conditioning(neg.prompt_embeds, extras=extras)
        channels = adapter.plan.latent_channels
        self.latent = torch.zeros(1, channels, *size) if mask is None else torch.randn(1, channels, *size)
        self.mask = mask
        self.settings = SamplingSettings(seed=5, steps=STEPS, cfg=cfg, sampler="euler", scheduler="simple")
        ms = model_sampling_for(adapter)
        self.expected = denoise_latent(
            adapter,
            ParallelMesh.single(),
            ms,
            self.pos,
            self.neg,
            self.latent,
            self.settings,
            noise_mask=mask,
            expert_2=comps.second_expert(),
        )

    def run(self, pool, **kwargs) -> torch.Tensor:
        pool.submit(load_model, self.path, "fp32", "sdpa").result(300)
        return pool.submit(
            generate, self.pos, self.neg, self.latent, self.settings, noise_mask=self.mask, **kwargs
        ).result(600)


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    err = ((got - expected).norm() / expected.norm()).item()
    assert err <= 1e-5, f"relative L2 difference {err:.2e} from one device"


@pytest.fixture(scope="module")
def t2v() -> Case:
    return Case("tiny-wan")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_text_to_video_layouts_equal_single_device(cpu_pool, t2v, layout):
    kwargs = {"patches": 4, "warmup": STEPS} if layout == "pp2" else {}
    _close(t2v.run(cpu_pool(LAYOUTS[layout]), **kwargs), t2v.expected)


@pytest.mark.parametrize("layout", ["ulysses2", "cfg2"])
def test_image_to_video_layouts_equal_single_device(cpu_pool, layout):
    """Wan 2.1 I2V: CLIP-vision K/V (replicated) and the start-image latent + mask channels (split with
    the tokens)."""
    g = torch.Generator().manual_seed(8)
    mask = torch.ones(1, 1, 3, 6, 10)
    mask[:, :, 0] = 0.0
    extras = {
        "image_embeds": torch.randn(1, 17, 48, generator=g),
        "concat_image": torch.randn(1, 16, 3, 6, 10, generator=g),
        "concat_mask": mask,
    }
    case = Case("tiny-wan-i2v", extras)
    _close(case.run(cpu_pool(LAYOUTS[layout])), case.expected)


@pytest.mark.parametrize("layout", ["ulysses2", "cfg2"])
def test_size_not_whole_tokens_is_padded_on_every_rank_as_on_one_device(cpu_pool, layout):
    """A 3 x 5 x 9 latent (ComfyUI's WanModel pads it circularly to 6 x 10 and crops back; tests/
    test_wan_comfy_reference.py holds that against ComfyUI): the padded tokens split over the ranks."""
    case = Case("tiny-wan", size=(3, 5, 9))
    got = case.run(cpu_pool(LAYOUTS[layout]))
    assert got.shape == (1, 16, 3, 5, 9)
    _close(got, case.expected)


def test_ti2v_per_frame_time_under_ulysses_equals_single_device(cpu_pool):
    """Wan 2.2 TI2V-5B with a kept first frame: per-token modulation split over the ranks with the tokens."""
    mask = torch.ones(1, 1, 3, 6, 10)
    mask[:, :, 0] = 0.0
    case = Case("tiny-wan-ti2v", mask=mask)
    _close(case.run(cpu_pool(LAYOUTS["ulysses2"])), case.expected)


def test_ti2v_noise_mask_under_pipefusion(cpu_pool):
    """Wan 2.2 TI2V-5B with a kept first frame on PipeFusion 2: stage 0 embeds with the per-frame timesteps
    the mask implies, the last stage applies the mask to each band (4 bands of 3, 2, 2, 2 of the 9 stacked
    token rows, so bands cross frames). warmup = steps: equal to one device; warmup 1 (stale K/V): close to
    it, and the kept frame is the start latent's, as on one device."""
    mask = torch.ones(1, 1, 3, 6, 10)
    mask[:, :, 0] = 0.0
    case = Case("tiny-wan-ti2v", mask=mask)
    pool = cpu_pool(LAYOUTS["pp2"])
    _close(case.run(pool, patches=4, warmup=STEPS), case.expected)
    stale = case.run(pool, patches=4, warmup=1)
    torch.testing.assert_close(stale[:, :, 0], case.latent[:, :, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(case.expected[:, :, 0], case.latent[:, :, 0], atol=1e-5, rtol=0)
    err = ((stale - case.expected).norm() / (case.expected - case.latent).norm()).item()
    assert 0 < err < 0.05, f"stale-KV result {err:.2e} (relative to the change sampling made) from one device"


def test_two_experts_under_ulysses_and_cfg_equal_single_device(cpu_pool):
    case = Case("tiny-wan-a14b")
    for layout in ("ulysses2", "cfg2"):
        _close(case.run(cpu_pool(LAYOUTS[layout])), case.expected)


def test_encode_and_decode_jobs_on_a_video_model(cpu_pool, t2v):
    """Parallel Text Encode runs UMT5 on the workers; the decode job gives IMAGE frames [T*4-3, H, W, 3]."""
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pool.submit(load_model, t2v.path, "fp32", "sdpa").result(300)
    (got,) = pool.submit(encode_text, ["a paper boat drifting down a gutter"]).result(120)
    assert torch.equal(got.prompt_embeds, t2v.pos.prompt_embeds)
    image = pool.submit(decode, t2v.expected).result(300)
    assert image.shape == (9, 48, 80, 3)
    comps = load_pipeline_components(t2v.path, "cpu", torch.float32, parts=("vae",))
    with torch.no_grad():
        own = comps.vae.decode(t2v.expected).sample
    torch.testing.assert_close(image, ((own + 1) / 2).clamp(0, 1)[0].movedim(0, -1), atol=2e-5, rtol=0)
