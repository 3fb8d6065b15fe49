"""tiny-flux-shapes, the trained built-in: ships in the package, loads through the normal loading code,
equals diffusers' own FluxPipeline on its folder, and its parallel layouts equal one device."""

from __future__ import annotations

import numpy as np
import torch

from dit_devtools.training.shapes_detector import detect
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.builtin import BUILTIN_MODELS, builtin_model_path
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, generate

PROMPT = "a red circle on a blue background"
PX = 64


def _components():
    return load_pipeline_components(builtin_model_path("tiny-flux-shapes"), "cpu", torch.float32)


def test_shipped_folder_is_a_schnell_like_flux_pipeline():
    comps = _components()
    assert "tiny-flux-shapes" in BUILTIN_MODELS
    assert comps.family == "flux" and comps.pipeline_class == "FluxPipeline"
    assert comps.transformer_config["guidance_embeds"] is False
    assert comps.scheduler_config["shift"] == 1.0 and comps.scheduler_config["use_dynamic_shifting"] is False
    assert comps.vae.config.latent_channels == 16 and len(comps.vae.config.block_out_channels) == 4


@torch.no_grad()
def test_single_device_equals_diffusers_flux_pipeline():
    from diffusers import FluxPipeline

    comps = _components()
    pipe = FluxPipeline.from_pretrained(builtin_model_path("tiny-flux-shapes"), torch_dtype=torch.float32)
    pos, _ = encode_prompts(comps, "flux", PROMPT, "")
    noise = torch.randn(1, 16, PX // 8, PX // 8, generator=torch.Generator().manual_seed(3))
    packed = pipe._pack_latents(noise, 1, 16, PX // 8, PX // 8)
    out = pipe(
        prompt_embeds=pos.prompt_embeds,
        pooled_prompt_embeds=pos.pooled,
        height=PX,
        width=PX,
        num_inference_steps=4,
        latents=packed,
        output_type="latent",
    ).images
    ref = pipe._unpack_latents(out, PX, PX, pipe.vae_scale_factor)
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    settings = SamplingSettings(seed=0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    raw = denoise_latent(
        adapter, ParallelMesh.single(), ms, pos, None, torch.zeros_like(noise), settings, start_model_space=noise
    )
    ours = adapter.plan.latent_format.to_model(raw)
    assert (ours - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())


def test_parallel_layouts_equal_single_device_and_draw_the_background(cpu_pool):
    comps = _components()
    pos, neg = encode_prompts(comps, "flux", PROMPT, "")
    latent = torch.zeros(1, 16, PX // 8, PX // 8)
    path = str(builtin_model_path("tiny-flux-shapes"))
    results = {}
    for name, config, cfg in (
        ("single", ParallelConfig(), 2.0),
        ("ulysses2", ParallelConfig(ulysses=2), 2.0),
        ("cfg2", ParallelConfig(cfg=2), 2.0),
    ):
        pool = cpu_pool(config)
        pool.submit(load_model, path, "fp32", "sdpa").result(300)
        settings = SamplingSettings(seed=1, steps=8, cfg=cfg, sampler="euler", scheduler="simple")
        results[name] = pool.submit(generate, pos, neg, latent, settings).result(300)
        if name == "single":
            image = pool.submit(decode, results[name]).result(300)
    for name in ("ulysses2", "cfg2"):
        assert (results[name] - results["single"]).abs().max().item() <= 1e-4 * max(
            1.0, results["single"].abs().max().item()
        ), name
    found = detect(np.asarray(image[0].clamp(0, 1)))
    assert found.background == "blue"
