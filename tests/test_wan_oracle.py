"""External oracle for Wan: our single-device engine equals diffusers' own WanPipeline /
WanImageToVideoPipeline on the tiny folders (same weights, text embeddings, initial noise and sigmas)."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.families.wan.conditioning import WanImageInputs
from parallel_runtime.models.families.wan.latent import WAN21, WAN22
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh

STEPS, FRAMES, PX = 3, 9, 32  # 3 latent frames of 4x4


def _ours(comps, pos, neg, sigmas, start, cfg):
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    settings = SamplingSettings(seed=0, cfg=cfg, sampler="euler", sigmas=sigmas)
    raw = denoise_latent(
        adapter, ParallelMesh.single(), ms, pos, neg, torch.zeros_like(start), settings, start_model_space=start
    )
    return adapter.plan.latent_format.to_model(raw)


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= 1e-4, f"relative L2 error {err:.2e}"


@torch.no_grad()
def test_wan_t2v_matches_diffusers_wan_pipeline():
    from diffusers import WanPipeline

    folder = ensure_tiny_model("tiny-wan")
    comps = load_pipeline_components(folder, "cpu", torch.float32)
    assert comps.adapter().plan.latent_format == WAN21  # read from the AutoencoderKLWan config
    pipe = WanPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pos, neg = encode_prompts(comps, "wan", "a red fox  &amp; a hen", "blurry")
    ref_pos, ref_neg = pipe.encode_prompt("a red fox  &amp; a hen", "blurry", max_sequence_length=512)
    torch.testing.assert_close(pos.prompt_embeds, ref_pos)
    torch.testing.assert_close(neg.prompt_embeds, ref_neg)
    noise = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(3))
    ref = pipe(
        prompt_embeds=pos.prompt_embeds,
        negative_prompt_embeds=neg.prompt_embeds,
        height=PX,
        width=PX,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        guidance_scale=5.0,
        latents=noise,
        output_type="latent",
    ).frames
    sigmas = pipe.scheduler.sigmas.float()
    _close(_ours(comps, pos, neg, sigmas, noise, cfg=5.0), ref)


@torch.no_grad()
def test_wan21_i2v_matches_diffusers_image_to_video_pipeline():
    """CLIP-vision image K/V, the start-image latent and mask as extra input channels (ComfyUI's form)."""
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    folder = ensure_tiny_model("tiny-wan-i2v")
    comps = load_pipeline_components(folder, "cpu", torch.float32)
    pipe = WanImageToVideoPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    image = Image.fromarray((torch.rand(PX, PX, 3, generator=torch.Generator().manual_seed(1)) * 255).byte().numpy())
    pos, neg = encode_prompts(comps, "wan", "a boat on a lake", "")
    embeds = pipe.encode_image(image, "cpu")
    pixels = pipe.video_processor.preprocess(image, height=PX, width=PX).unsqueeze(2)
    video = torch.cat([pixels, pixels.new_zeros(1, 3, FRAMES - 1, PX, PX)], dim=2)
    start = pipe.vae.encode(video).latent_dist.mode()  # the raw start-image latent (ComfyUI's concat_latent_image)
    mask = torch.ones(1, 1, 3, 4, 4)
    mask[:, :, 0] = 0.0  # ComfyUI's concat_mask: 0 where the start image is kept
    inputs = WanImageInputs(image_embeds=embeds, concat_image=start, concat_mask=mask)
    pos, neg = (type(c)(c.prompt_embeds, extras=inputs) for c in (pos, neg))
    noise = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(4))
    ref = pipe(
        image=image,
        prompt_embeds=pos.prompt_embeds,
        negative_prompt_embeds=neg.prompt_embeds,
        height=PX,
        width=PX,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=noise,
        output_type="latent",
    ).frames
    _close(_ours(comps, pos, neg, pipe.scheduler.sigmas.float(), noise, cfg=4.0), ref)


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-wan-ti2v"])
def test_wan_video_from_seed_is_deterministic_and_finite(name):
    comps = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)
    adapter = comps.adapter()
    fmt = adapter.plan.latent_format
    assert fmt == (WAN22 if name.endswith("ti2v") else WAN21)
    pos, neg = encode_prompts(comps, "wan", "a cat", "")
    ms = model_sampling_for(adapter)
    latent = torch.zeros(1, fmt.channels, 3, 4, 4)
    s = SamplingSettings(seed=11, steps=3, cfg=2.0, sampler="euler_ancestral", scheduler="karras")
    a = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, s)
    b = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, s)
    assert a.shape == latent.shape and torch.isfinite(a).all() and torch.equal(a, b)


@torch.no_grad()
def test_two_experts_switch_as_diffusers_and_equal_two_passes_by_hand():
    """Wan 2.2 A14B: the high-noise expert above the boundary, the low-noise one below, as diffusers'
    WanPipeline switches them (transformer / transformer_2, boundary_ratio); and the same as two
    KSamplerAdvanced passes by hand (leftover noise kept, then continued without new noise)."""
    from diffusers import WanPipeline, WanTransformer3DModel

    from parallel_runtime.models.registry import get_adapter

    folder = ensure_tiny_model("tiny-wan-a14b")
    comps = load_pipeline_components(folder, "cpu", torch.float32)
    high = comps.adapter()
    second = WanTransformer3DModel.from_pretrained(folder / "transformer_2", torch_dtype=torch.float32).eval()
    low = get_adapter(second, high.plan.latent_format)
    pipe = WanPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    boundary = pipe.config.boundary_ratio
    pos, neg = encode_prompts(comps, "wan", "a lighthouse at dusk", "")
    noise = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(5))
    steps = 4
    ref = pipe(
        prompt_embeds=pos.prompt_embeds,
        negative_prompt_embeds=neg.prompt_embeds,
        height=PX,
        width=PX,
        num_frames=FRAMES,
        num_inference_steps=steps,
        guidance_scale=3.0,
        latents=noise,
        output_type="latent",
    ).frames
    sigmas = pipe.scheduler.sigmas.float()
    switch = int((sigmas[:-1] < boundary).nonzero()[0])  # the first step of the low-noise expert
    assert 0 < switch < steps, "the schedule must cross the boundary for this test to mean anything"
    ms = model_sampling_for(high)
    mesh, fmt = ParallelMesh.single(), high.plan.latent_format
    settings = SamplingSettings(seed=0, cfg=3.0, sampler="euler", sigmas=sigmas)
    latent = torch.zeros_like(noise)
    both = denoise_latent(high, mesh, ms, pos, neg, latent, settings, start_model_space=noise, expert_2=(low, boundary))
    _close(fmt.to_model(both), ref)
    first = SamplingSettings(**{**settings.__dict__, "end_at_step": switch, "return_with_leftover_noise": True})
    mid = denoise_latent(high, mesh, ms, pos, neg, latent, first, start_model_space=noise)
    rest = SamplingSettings(**{**settings.__dict__, "start_at_step": switch, "add_noise": False})
    by_hand = denoise_latent(low, mesh, ms, pos, neg, mid, rest)
    torch.testing.assert_close(by_hand, both, rtol=1e-5, atol=1e-5)
    # and one expert alone is something else: the switch matters
    alone = denoise_latent(high, mesh, ms, pos, neg, latent, settings, start_model_space=noise)
    assert (alone - both).abs().max() > 1e-3


def test_ksampler_advanced_step_window_is_comfyuis():
    """comfy.samplers.KSampler.sample: cut to end_at_step (last sigma 0 unless leftover noise is returned),
    then from start_at_step; a start at or past the last step returns the input latent."""
    from parallel_runtime.denoise.loop import step_window

    sigmas = torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0])
    cut = step_window(sigmas, SamplingSettings(end_at_step=2))
    assert cut.tolist() == [1.0, 0.75, 0.0]
    cut = step_window(sigmas, SamplingSettings(end_at_step=2, return_with_leftover_noise=True))
    assert cut.tolist() == [1.0, 0.75, 0.5]
    assert step_window(sigmas, SamplingSettings(start_at_step=2)).tolist() == [0.5, 0.25, 0.0]
    assert step_window(sigmas, SamplingSettings(start_at_step=4)).numel() == 1  # nothing left to run
    assert torch.equal(step_window(sigmas, SamplingSettings()), sigmas)
    comps = load_pipeline_components(ensure_tiny_model("tiny-wan"), "cpu", torch.float32)
    adapter = comps.adapter()
    latent = torch.randn(1, 16, 3, 4, 4)
    ms = model_sampling_for(adapter)
    out = denoise_latent(
        adapter, ParallelMesh.single(), ms, None, None, latent, SamplingSettings(steps=3, start_at_step=3)
    )
    assert torch.equal(out, latent)
