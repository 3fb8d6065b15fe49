"""HunyuanVideo 1.5 image-to-video (the start image's VAE latent on the first frame's condition channels, its
SigLIP states joining the text; both given by the caller in ``GlyphText``). Oracle: diffusers'
HunyuanVideo15ImageToVideoPipeline on the tiny model (its image encoders replaced by the same given tensors), then
Ulysses 2, CFG 2 and PipeFusion 2 in real worker processes (gloo) equal to one device."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from PIL import Image

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hunyuan_video15.conditioning import GlyphText
from parallel_runtime.models.families.hunyuan_video15.text import template_crop
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

FAMILY = "hunyuan-video-1.5"
NAME = "tiny-hunyuan-video-1.5"
POSITIVE, NEGATIVE = 'a shop window with a sign that says "open", warm light', "blurry, static"
LAYOUTS = {"ulysses2": ParallelConfig(ulysses=2), "cfg2": ParallelConfig(cfg=2), "pp2": ParallelConfig(pp=2)}


def _start_image(h: int, w: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A start image's raw latent [1, 8, 1, h, w] and SigLIP-like states [1, 7, 16] (the tiny image width)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 8, 1, h, w, generator=g), torch.randn(1, 7, 16, generator=g)


def _with_image(cond: Conditioning, start: torch.Tensor, embeds: torch.Tensor) -> Conditioning:
    return dataclasses.replace(cond, extras=dataclasses.replace(cond.extras, start_latent=start, image_embeds=embeds))


def _close(ours: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= tol, f"relative L2 error {err:.2e}"


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32)


@torch.no_grad()
def test_adapter_equals_the_transformers_image_to_video_forward(comps):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 3, 4, 6, generator=g)
    mllm, byt5 = torch.randn(2, 9, 32, generator=g), torch.randn(2, 6, 32, generator=g)
    m1, m2 = torch.ones(2, 9), torch.ones(2, 6)
    m1[0, 7:], m2[:, 4:] = 0, 0
    start, embeds = _start_image(4, 6, 1)
    t = torch.tensor([700.0, 250.0])
    scale = comps.adapter().plan.latent_format.scale
    condition = torch.zeros(2, 9, 3, 4, 6)
    condition[:, :8, :1], condition[:, 8, 0] = start * scale, 1.0
    ref = comps.transformer(
        torch.cat([x, condition], 1), t, mllm, m1, encoder_hidden_states_2=byt5, encoder_attention_mask_2=m2,
        image_embeds=embeds.repeat(2, 1, 1),
    ).sample  # fmt: skip
    mesh = ParallelMesh.single()
    cond = Conditioning(mllm, None, m1, GlyphText(byt5, m2, start, embeds.repeat(2, 1, 1)))
    ours = comps.adapter().forward(x, t, cond, mesh, SequenceParallelAttention(mesh, "sdpa"))
    _close(ours, ref, 1e-6)
    text_to_video = comps.adapter().forward(x, t, Conditioning(mllm, None, m1, GlyphText(byt5, m2)), mesh,
                                            SequenceParallelAttention(mesh, "sdpa"))  # fmt: skip
    assert ((text_to_video - ours).norm() / ours.norm()) > 1e-2  # the start image changes the prediction
    with pytest.raises(ConfigError, match="SigLIP"):
        comps.adapter().forward(x, t, Conditioning(mllm, None, m1, GlyphText(byt5, m2, start)), mesh,
                                SequenceParallelAttention(mesh, "sdpa"))  # fmt: skip


@torch.no_grad()
def test_i2v_matches_diffusers_hunyuan_video15_image_to_video_pipeline(comps):
    from diffusers import ClassifierFreeGuidance, HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline

    t2v = HunyuanVideo15Pipeline.from_pretrained(comps.path, torch_dtype=torch.float32)
    pipe = HunyuanVideo15ImageToVideoPipeline(**t2v.components, image_encoder=None, feature_extractor=None)
    pipe.prompt_template_encode_start_idx = template_crop(pipe.tokenizer)
    start, embeds = _start_image(2, 2, 4)
    scale = comps.adapter().plan.latent_format.scale
    # the pipeline's own image encoders, replaced by the states the caller gives (model space: x scaling_factor)
    pipe.encode_image = lambda **kw: embeds.repeat(kw["batch_size"], 1, 1)
    pipe._get_image_latents = lambda **kw: start * scale
    pos, neg = encode_prompts(comps, FAMILY, POSITIVE, NEGATIVE)

    def inputs(c: Conditioning, prefix: str) -> dict:
        glyph = c.extras.byt5 if c.extras.byt5.shape[1] else torch.zeros(1, 1, 32)
        return {
            f"{prefix}prompt_embeds": c.prompt_embeds,
            f"{prefix}prompt_embeds_mask": torch.ones(c.prompt_embeds.shape[:2]),
            f"{prefix}prompt_embeds_2": glyph,
            f"{prefix}prompt_embeds_mask_2": torch.ones(glyph.shape[:2]) * bool(c.extras.byt5.shape[1]),
        }

    noise = torch.randn(1, 8, 3, 2, 2, generator=torch.Generator().manual_seed(3))
    pipe.guider = ClassifierFreeGuidance(guidance_scale=4.0)
    ref = pipe(
        Image.new("RGB", (32, 32)), **inputs(pos, ""), **inputs(neg, "negative_"), num_frames=9,
        num_inference_steps=3, latents=noise, output_type="latent",
    ).frames  # fmt: skip
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=4.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    pos, neg = _with_image(pos, start, embeds), _with_image(neg, start, embeds)
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, torch.zeros_like(noise), settings,
        start_model_space=noise,
    )  # fmt: skip
    _close(adapter.plan.latent_format.to_model(raw), ref)


class Case:
    """The tiny model's image-to-video conditioning and its single-device result."""

    def __init__(self):
        self.path = str(ensure_tiny_model(NAME))
        comps = load_pipeline_components(self.path, "cpu", torch.float32)
        adapter = comps.adapter()
        start, embeds = _start_image(3, 5, 7)
        pos, neg = encode_prompts(comps, FAMILY, POSITIVE, NEGATIVE)
        self.pos, self.neg = _with_image(pos, start, embeds), _with_image(neg, start, embeds)
        self.latent = torch.zeros(1, 8, 3, 3, 5)
        self.settings = SamplingSettings(seed=5, steps=3, cfg=4.0, sampler="euler_ancestral", scheduler="simple")
        ms, mesh = model_sampling_for(adapter), ParallelMesh.single()
        self.expected = denoise_latent(adapter, mesh, ms, self.pos, self.neg, self.latent, self.settings)
        plain = denoise_latent(adapter, mesh, ms, pos, neg, self.latent, self.settings)
        assert ((plain - self.expected).norm() / self.expected.norm()) > 1e-2  # the image matters here too


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_i2v_layouts_equal_single_device(cpu_pool, case, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, case.path, "fp32", "sdpa").result(300)
    kwargs = {"patches": 3, "warmup": case.settings.steps} if layout == "pp2" else {}
    got = pool.submit(generate, case.pos, case.neg, case.latent, case.settings, **kwargs).result(600)
    _close(got, case.expected, 1e-5)
