"""External oracle: our single-device engine equals diffusers' own pipelines on the tiny folders
(same weights, text embeddings, initial noise and sigmas)."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh

STEPS = 4
PX = 128  # 16x16 latent


def _components(name):
    return load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)


def _ours(comps, pos, neg, sigmas, start, cfg, guidance=None):
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    latent = torch.zeros_like(start)
    settings = SamplingSettings(seed=0, cfg=cfg, sampler="euler", sigmas=sigmas, guidance=guidance)
    raw = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings, start_model_space=start)
    return adapter.plan.latent_format.to_model(raw)


@torch.no_grad()
def test_flux_matches_diffusers_flux_pipeline():
    from diffusers import FluxPipeline

    comps = _components("tiny-flux")
    pipe = FluxPipeline.from_pretrained(ensure_tiny_model("tiny-flux"), torch_dtype=torch.float32)
    pos, neg = encode_prompts(comps, "flux", "a red fox", "")
    noise = torch.randn(1, 16, 16, 16, generator=torch.Generator().manual_seed(3))
    packed = pipe._pack_latents(noise, 1, 16, 16, 16)
    out = pipe(
        prompt_embeds=pos.prompt_embeds,
        pooled_prompt_embeds=pos.pooled,
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=packed,
        output_type="latent",
    ).images
    ref = pipe._unpack_latents(out, PX, PX, pipe.vae_scale_factor)
    sigmas = pipe.scheduler.sigmas.float()
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and sigmas.numel() == STEPS + 1
    ours = _ours(comps, pos, None, sigmas, noise, cfg=1.0, guidance=4.0)
    assert (ours - ref).abs().max().item() <= 1e-4


@torch.no_grad()
def test_sd3_matches_diffusers_sd3_pipeline_with_cfg():
    from diffusers import StableDiffusion3Pipeline

    comps = _components("tiny-sd3")
    pipe = StableDiffusion3Pipeline.from_pretrained(ensure_tiny_model("tiny-sd3"), torch_dtype=torch.float32)
    pos, neg = encode_prompts(comps, "sd3", "a lighthouse at dusk", "blurry")
    noise = torch.randn(1, 16, 16, 16, generator=torch.Generator().manual_seed(4))
    ref = pipe(
        prompt_embeds=pos.prompt_embeds,
        pooled_prompt_embeds=pos.pooled,
        negative_prompt_embeds=neg.prompt_embeds,
        negative_pooled_prompt_embeds=neg.pooled,
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        latents=noise,
        output_type="latent",
    ).images
    sigmas = pipe.scheduler.sigmas.float()
    ours = _ours(comps, pos, neg, sigmas, noise, cfg=5.0)
    assert (ours - ref).abs().max().item() <= 1e-4


@torch.no_grad()
def test_pixart_matches_diffusers_pixart_pipeline_with_ddim():
    from diffusers import DDIMScheduler, PixArtAlphaPipeline

    comps = _components("tiny-pixart")
    pipe = PixArtAlphaPipeline.from_pretrained(ensure_tiny_model("tiny-pixart"), torch_dtype=torch.float32)
    pipe.scheduler = DDIMScheduler.from_config(
        pipe.scheduler.config, clip_sample=False, set_alpha_to_one=True, timestep_spacing="leading"
    )
    pos, neg = encode_prompts(comps, "pixart", "a bowl of cherries", "")
    noise = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(5))
    ref = pipe(
        prompt_embeds=pos.prompt_embeds,
        prompt_attention_mask=pos.attention_mask,
        negative_prompt_embeds=neg.prompt_embeds,
        negative_prompt_attention_mask=neg.attention_mask,
        negative_prompt=None,
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        guidance_scale=4.5,
        latents=noise,
        output_type="latent",
        use_resolution_binning=False,
    ).images
    # DDIM (eta 0) is Euler in sigma = sqrt((1 - a) / a) on x / sqrt(a) (formula), ending at sigma 0.
    alphas = pipe.scheduler.alphas_cumprod.double()
    ts = pipe.scheduler.timesteps.long()
    sig = ((1 - alphas[ts]) / alphas[ts]).sqrt()
    sigmas = torch.cat([sig, torch.zeros(1, dtype=sig.dtype)]).float()
    start = noise / alphas[ts[0]].sqrt().float()
    ours = _ours(comps, pos, neg, sigmas, start, cfg=4.5)
    assert (ours - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("name", ["tiny-flux", "tiny-sd3", "tiny-pixart"])
def test_txt2img_from_seed_is_deterministic_and_finite(name):
    comps = _components(name)
    adapter = comps.adapter()
    pos, neg = encode_prompts(comps, comps.family, "a cat", "")
    ms = model_sampling_for(adapter)
    latent = torch.zeros(1, adapter.plan.latent_channels, 16, 16)
    s = SamplingSettings(seed=11, steps=3, cfg=2.0, sampler="euler_ancestral", scheduler="karras")
    a = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, s)
    b = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, s)
    c = denoise_latent(
        adapter, ParallelMesh.single(), ms, pos, neg, latent, SamplingSettings(**{**s.__dict__, "seed": 12})
    )
    assert torch.isfinite(a).all() and torch.equal(a, b) and not torch.equal(a, c)
