"""LTX-Video 0.9. In process: the adapter's embed -> blocks -> output equals the transformer's forward (frame rate,
padded text masked), the text encoding equals LTXPipeline.encode_prompt, the single-device engine equals
LTXPipeline with CFG, the VAE decode equals diffusers' (the latent un-normalised by the VAE's statistics). In real
worker processes (gloo): Ulysses, Ring, CFG parallel and PipeFusion equal one device, and the VAE decoded
band-parallel too."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.ltx_video.conditioning import LTXFrameRate
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, generate
from parallel_runtime.vae.decode import decode_latent

FAMILY = "ltx-video"
NAME = "tiny-ltx-video"
POSITIVE, NEGATIVE = "a red fox runs through snow, slow motion", "blurry, static"
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
}


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32)


@pytest.fixture(scope="module")
def pipe(comps):
    from diffusers import LTXPipeline

    return LTXPipeline.from_pretrained(comps.path, torch_dtype=torch.float32)


def _close(ours: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= tol, f"relative L2 error {err:.2e}"


def _packed(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(2).transpose(1, 2)  # [B, C, T, H, W] -> [B, T*H*W, C] (patch 1)


@torch.no_grad()
def test_adapter_equals_the_transformers_forward(comps):
    adapter = comps.adapter()
    assert adapter.plan.latent_channels == 128 and adapter.num_blocks == 2 and adapter.plan.text_attention == "cross"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, 3, 4, 6, generator=g)
    text = torch.randn(2, 9, 32, generator=g)
    mask = torch.ones(2, 9)
    mask[0, 7:], mask[1, 5:] = 0, 0  # prompts of different lengths: padded tokens masked
    t = torch.tensor([700.0, 250.0])
    mesh = ParallelMesh.single()
    for rate in (24.0, None):  # a frame rate on the conditioning, and the default 25
        ref = comps.transformer(
            _packed(x), text, t, mask, num_frames=3, height=4, width=6,
            rope_interpolation_scale=(8 / (rate or 25.0), 32, 32),
        ).sample  # fmt: skip
        extras = None if rate is None else LTXFrameRate(torch.tensor([rate, rate]))
        ours = adapter.forward(
            x, t / 1000, Conditioning(text, None, mask, extras), mesh, SequenceParallelAttention(mesh)
        )
        _close(_packed(ours), ref, 1e-6)
    other = adapter.forward(x, t / 1000, Conditioning(text, None, mask, LTXFrameRate(torch.tensor([12.0]))), mesh,
                            SequenceParallelAttention(mesh))  # fmt: skip
    assert ((other - ours).norm() / ours.norm()).item() > 1e-3  # the frame rate moves the time positions
    with pytest.raises(ConfigError, match="frame rate"):
        adapter.forward(x, t, Conditioning(text, None, mask, LTXFrameRate(torch.tensor([0.0, 25.0]))), mesh,
                        SequenceParallelAttention(mesh))  # fmt: skip


@torch.no_grad()
def test_text_encoding_equals_the_pipelines_encode_prompt(comps, pipe):
    prompts = [POSITIVE, "a dog"]
    ref, ref_mask, _, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, device="cpu")
    ours = encode_prompts(comps, FAMILY, prompts, "")[0]
    torch.testing.assert_close(ours.prompt_embeds, ref)
    torch.testing.assert_close(ours.attention_mask.bool(), ref_mask)
    assert ours.prompt_embeds.shape[1] == 128


@torch.no_grad()
def test_t2v_matches_diffusers_ltx_pipeline(comps, pipe):
    pos, neg = encode_prompts(comps, FAMILY, POSITIVE, NEGATIVE)
    noise = torch.randn(1, 128, 2, 2, 3, generator=torch.Generator().manual_seed(3))
    ref = pipe(
        prompt_embeds=pos.prompt_embeds, prompt_attention_mask=pos.attention_mask,
        negative_prompt_embeds=neg.prompt_embeds, negative_prompt_attention_mask=neg.attention_mask,
        height=64, width=96, num_frames=9, frame_rate=25, num_inference_steps=3, guidance_scale=3.0,
        latents=_packed(noise), output_type="latent",
    ).frames  # fmt: skip
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=3.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, torch.zeros_like(noise), settings,
        start_model_space=noise,
    )  # fmt: skip
    _close(_packed(adapter.plan.latent_format.to_model(raw)), ref)


@torch.no_grad()
def test_vae_decode_equals_diffusers(comps):
    vae = comps.vae
    z = torch.randn(1, 128, 2, 3, 2, generator=torch.Generator().manual_seed(1))
    ours = decode_latent(vae, z, ParallelMesh.single(), None)
    raw = z * vae.latents_std.view(1, -1, 1, 1, 1) / vae.config.scaling_factor + vae.latents_mean.view(1, -1, 1, 1, 1)
    torch.testing.assert_close(ours, vae.decode(raw).sample, atol=1e-5, rtol=0)
    assert ours.shape == (1, 3, 9, 96, 64)


class Case:
    """The tiny model's conditioning (24 fps) and its single-device result."""

    def __init__(self):
        self.path = str(ensure_tiny_model(NAME))
        comps = load_pipeline_components(self.path, "cpu", torch.float32)
        adapter = comps.adapter()
        pos, neg = encode_prompts(comps, FAMILY, POSITIVE, NEGATIVE)
        rate = LTXFrameRate(torch.tensor([24.0]))
        self.pos, self.neg = (Conditioning(c.prompt_embeds, None, c.attention_mask, rate) for c in (pos, neg))
        self.latent = torch.zeros(1, 128, 3, 3, 5)  # 45 tokens: divisible by neither 2 nor 4
        self.settings = SamplingSettings(seed=5, steps=3, cfg=3.0, sampler="euler_ancestral", scheduler="simple")
        mesh = ParallelMesh.single()
        self.expected = denoise_latent(
            adapter, mesh, model_sampling_for(adapter), self.pos, self.neg, self.latent, self.settings
        )


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_equal_single_device(cpu_pool, case, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, case.path, "fp32", "sdpa").result(300)
    kwargs = {"patches": 3, "warmup": case.settings.steps} if layout == "pp2" else {}
    got = pool.submit(generate, case.pos, case.neg, case.latent, case.settings, **kwargs).result(600)
    _close(got, case.expected, 1e-5)
    if layout == "ulysses2":  # the decode job: the VAE's rows over the two ranks, equal to diffusers' decode
        image = pool.submit(decode, case.expected).result(300)
        vae = load_pipeline_components(case.path, "cpu", torch.float32, parts=("vae",)).vae
        shape = (1, -1, 1, 1, 1)
        with torch.no_grad():
            own = vae.decode(case.expected * vae.latents_std.view(shape) + vae.latents_mean.view(shape)).sample
        assert image.shape == (17, 96, 160, 3)
        torch.testing.assert_close(image, ((own + 1) / 2).clamp(0, 1)[0].movedim(0, -1), atol=2e-5, rtol=0)
