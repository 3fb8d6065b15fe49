"""FLUX.2 reference images equal diffusers' Flux2Pipeline ``image=`` on one device and our single device on
Ulysses 2 / Ring 2 / CFG 2 (the reference tokens split with the image's, on both CFG branches) and PipeFusion 2.

Oracle: Flux2Pipeline on the tiny FLUX.2 components with two reference images of different sizes (ComfyUI
0.3.64 has no FLUX.2): the references it VAE-encodes are given to our sampler as ``reference_latents`` (a FLUX.2
LATENT is the packed latent the pipeline appends), so any difference is in how the tokens ride in the sequence
(ids at t = 10, 20; appended after the image's; the prediction keeps the image's tokens).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from PIL import Image

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.caching.specs import BlockCacheSpec
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.regions import Region
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.flux2.comfy_inputs import reference_images
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompt, encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate
from parallel_runtime.service.sampling_checks import check_branches_for_layout

STEPS = 3
PX = 128
TOLERANCE = 1e-4


def _image(width: int, height: int, seed: int) -> Image.Image:
    pixels = torch.randint(0, 256, (height, width, 3), generator=torch.Generator().manual_seed(seed))
    return Image.fromarray(pixels.to(torch.uint8).numpy())


def _with_refs(cond, latents):
    return dataclasses.replace(cond, extras=reference_images({"reference_latents": latents}, {}, "positive"))


def _ours(comps, pos, noise, sigmas):
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=1.0, sampler="euler", sigmas=sigmas, guidance=4.0)
    raw = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, None, torch.zeros_like(noise), settings,
        start_model_space=noise,
    )  # fmt: skip
    return adapter.plan.latent_format.to_model(raw)


@torch.no_grad()
def test_flux2_references_match_diffusers_flux2_pipeline():
    from diffusers import Flux2Pipeline

    name = "tiny-flux2"
    comps = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)
    pipe = Flux2Pipeline.from_pretrained(ensure_tiny_model(name), torch_dtype=torch.float32)
    encoded: list[torch.Tensor] = []
    encode = pipe._encode_vae_image

    def keep(*args, **kwargs):
        encoded.append(encode(*args, **kwargs))
        return encoded[-1]

    pipe._encode_vae_image = keep
    pos = encode_prompt(comps, "flux2", "the same cat, now in the snow")
    side = PX // 16
    noise = torch.randn(1, 16, side, side, generator=torch.Generator().manual_seed(4))
    out = pipe(
        image=[_image(PX, PX, 1), _image(96, 64, 2)],
        prompt_embeds=pos.prompt_embeds,
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=noise,
        output_type="latent",
    ).images
    expected = out.reshape(1, side, side, 16).permute(0, 3, 1, 2)
    assert [tuple(e.shape[-2:]) for e in encoded] == [(side, side), (4, 6)]
    sigmas = pipe.scheduler.sigmas.float()
    got = _ours(comps, _with_refs(pos, encoded), noise, sigmas)
    assert (got - expected).abs().max().item() <= TOLERANCE
    # the oracle sees the references (weakly, at random weights): without them, or swapped (each at the other's
    # time coordinate), the result is at least 10x the tolerance from the pipeline's
    assert (_ours(comps, pos, noise, sigmas) - expected).abs().max().item() > 10 * TOLERANCE
    swapped = _ours(comps, _with_refs(pos, encoded[::-1]), noise, sigmas)
    assert (swapped - expected).abs().max().item() > 10 * TOLERANCE


def test_reference_ids_follow_flux2_pipeline():
    refs = reference_images({"reference_latents": [torch.ones(1, 16, 2, 3), torch.ones(1, 16, 3, 1)]}, {}, "positive")
    assert refs.tokens.shape == (1, 2 * 3 + 3 * 1, 16)
    ids = refs.ids[0]
    assert ids[:6].tolist() == [[10, r, c, 0] for r in range(2) for c in range(3)]
    assert ids[6:].tolist() == [[20, r, 0, 0] for r in range(3)]


def test_flux2_reference_errors_say_what_why_fix():
    """The offset placement has no FLUX.2 convention and a latent of another VAE is refused; PipeFusion takes
    reference images, but not on an area's entry nor with a block cache."""
    with pytest.raises(ConfigError, match="why:"):
        reference_images(
            {"reference_latents": [torch.zeros(1, 16, 4, 4)], "reference_latents_method": "offset"}, {}, "positive"
        )
    with pytest.raises(ConfigError, match="why:"):
        reference_images({"reference_latents": [torch.zeros(1, 4, 4, 4)]}, {"latent_channels": 16}, "positive")
    refs = reference_images({"reference_latents": [torch.zeros(1, 16, 4, 4)]}, {}, "positive")
    entry = CondEntry(dataclasses.replace(_text(), extras=refs))
    check_branches_for_layout(ParallelConfig(ulysses=2), 1.0, (entry,), None)
    check_branches_for_layout(ParallelConfig(pp=2), 1.0, (entry,), None)  # PipeFusion runs them (per-step K/V)
    with pytest.raises(ConfigError, match="block cache"):
        check_branches_for_layout(ParallelConfig(pp=2), 1.0, (entry,), None, "euler", BlockCacheSpec())
    with pytest.raises(ConfigError, match="area"):
        boxed = dataclasses.replace(entry, region=Region(area_fraction=(0.5, 0.5, 0.0, 0.0)))
        check_branches_for_layout(ParallelConfig(pp=2), 1.0, (boxed,), None)


def _text():
    from parallel_runtime.models.base import Conditioning

    return Conditioning(torch.zeros(1, 3, 32))


# 208 x 144 px -> 13 x 9 packed latent pixels (odd: uneven shards); references of 5x7 and 4x4 latent pixels
WIDTH, HEIGHT = 208, 144
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pipefusion2": ParallelConfig(pp=2),  # every step warmup: exact (tests/test_pipefusion_references.py: stale)
}


@pytest.fixture(scope="module")
def single_device():
    name = "tiny-flux2"
    comps = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)
    pos, neg = encode_prompts(comps, comps.family, "the same cat, now in the snow", "low quality")
    gen = torch.Generator().manual_seed(5)
    latents = [torch.randn(1, 16, 5, 7, generator=gen), torch.randn(1, 16, 4, 4, generator=gen)]
    pos, neg = _with_refs(pos, latents), _with_refs(neg, latents[:1])  # both branches carry references
    latent = torch.zeros(1, 16, HEIGHT // 16, WIDTH // 16)
    settings = SamplingSettings(seed=7, steps=STEPS, cfg=2.5, sampler="euler", guidance=4.0)
    adapter = comps.adapter()
    with torch.no_grad():
        out = denoise_latent(adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, latent, settings)
    return pos, neg, latent, settings, out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_flux2_references_on_every_sequence_layout_equal_single_device(cpu_pool, single_device, layout):
    pos, neg, latent, settings, expected = single_device
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, str(ensure_tiny_model("tiny-flux2")), "fp32", "sdpa").result(300)
    pipefusion = {"warmup": STEPS} if LAYOUTS[layout].pp > 1 else {}
    got = pool.submit(generate, pos, neg, latent, settings, **pipefusion).result(300)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOLERANCE * max(1.0, expected.abs().max().item())
