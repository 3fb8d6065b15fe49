"""SD3.5 Large's structure (RMS q/k norms, no dual attention; tiny-sd3 with ``dual_attention_layers=()``): our
single device equals diffusers' StableDiffusion3Pipeline on the same tiny components, and every layout (Ulysses,
Ring, CFG parallel, PipeFusion with warmup = steps) equals our single device. SD3.5 Medium's structure (MMDiT-X:
dual attention in block 0 and RMS q/k norms) is tiny-sd3 itself, checked the same way by test_engine_oracle.py
and test_parallel_generate.py; both against ComfyUI's KSampler in test_family_sd35_comfy.py."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import build_tiny_pipeline
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

LARGE = dict(dual_attention_layers=())  # tiny-sd3 (qk_norm rms_norm) without MMDiT-X's second attention
STEPS = 3
WIDTH, HEIGHT = 208, 144  # 13 x 9 tokens: odd, divisible by neither 2 nor 4
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
}


class Large:
    """The tiny SD3.5-Large-structured pipeline, its prompts and single-device result."""

    def __init__(self, root):
        self.path = str(build_tiny_pipeline("tiny-sd3", root / "tiny-sd3.5-large", **LARGE))
        self.comps = load_pipeline_components(self.path, "cpu", torch.float32)
        self.pos, self.neg = encode_prompts(self.comps, "sd3", "a lighthouse at dusk", "blurry")
        self.latent = torch.zeros(1, 16, HEIGHT // 8, WIDTH // 8)
        self.settings = SamplingSettings(seed=3, steps=STEPS, cfg=4.5, sampler="euler")
        self._result: torch.Tensor | None = None

    def result(self) -> torch.Tensor:
        if self._result is None:
            adapter = self.comps.adapter()
            ms = model_sampling_for(adapter)
            args = (self.pos, self.neg, self.latent, self.settings)
            self._result = denoise_latent(adapter, ParallelMesh.single(), ms, *args)
        return self._result


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    return Large(tmp_path_factory.mktemp("sd35"))


def test_the_tiny_large_has_large_s_structure(large):
    config = large.comps.transformer_config
    assert config["qk_norm"] == "rms_norm" and not config["dual_attention_layers"]
    blocks = large.comps.transformer.transformer_blocks
    assert all(b.attn2 is None and b.attn.norm_q is not None for b in blocks)


@torch.no_grad()
def test_engine_equals_diffusers_sd3_pipeline_with_cfg(large):
    from diffusers import StableDiffusion3Pipeline

    pipe = StableDiffusion3Pipeline.from_pretrained(large.path, torch_dtype=torch.float32)
    noise = torch.randn(1, 16, 16, 16, generator=torch.Generator().manual_seed(4))
    ref = pipe(
        prompt_embeds=large.pos.prompt_embeds,
        pooled_prompt_embeds=large.pos.pooled,
        negative_prompt_embeds=large.neg.prompt_embeds,
        negative_pooled_prompt_embeds=large.neg.pooled,
        height=128,
        width=128,
        num_inference_steps=4,
        guidance_scale=5.0,
        latents=noise,
        output_type="latent",
    ).images
    adapter = large.comps.adapter()
    settings = SamplingSettings(seed=0, cfg=5.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    raw = denoise_latent(
        adapter,
        ParallelMesh.single(),
        model_sampling_for(adapter),
        large.pos,
        large.neg,
        torch.zeros_like(noise),
        settings,
        start_model_space=noise,
    )
    ours = adapter.plan.latent_format.to_model(raw)
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_equals_single_device(cpu_pool, large, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, large.path, "fp32", "sdpa").result(300)
    extra = dict(patches=3, warmup=STEPS) if layout == "pp2" else {}
    got = pool.submit(generate, large.pos, large.neg, large.latent, large.settings, **extra).result(300)
    expected = large.result()
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


@pytest.mark.parametrize("variant", ["sd3.5-large", "sd3.5-medium"])
def test_a_release_sized_file_reads_back_the_shipped_config(tmp_path, variant):
    """Every tensor name and shape of Stability's sd3.5_large / sd3.5_medium.safetensors (computed from the shipped
    diffusers config: 38 blocks x 2432 wide; 24 x 1536 with dual attention in blocks 0-12 and a 384-wide position
    table), as a header-only file under ``model.diffusion_model.``: detection gives back that variant and config."""
    from original_layout_files import same_config_value, write_header_only  # tests/ helpers

    from parallel_runtime.models.families.sd3.keys import skeleton
    from parallel_runtime.models.single_file import inspect_single_file, shipped_config

    base, _ = shipped_config(variant)
    shapes = {f"model.diffusion_model.{k}": s for k, s in skeleton(base).items()}
    info = inspect_single_file(write_header_only(tmp_path / f"{variant.replace('-', '_')}.safetensors", shapes))
    assert (info.family, info.variant, info.prefix) == ("sd3", variant, "model.diffusion_model.")
    keys = ("num_layers", "num_attention_heads", "attention_head_dim", "caption_projection_dim", "joint_attention_dim")
    keys += ("pooled_projection_dim", "pos_embed_max_size", "in_channels", "out_channels", "qk_norm")
    for key in keys:
        assert same_config_value(info.config[key], base[key]), key
    dual = list(base.get("dual_attention_layers") or ())  # Large's config leaves it to diffusers' default: none
    assert list(info.config["dual_attention_layers"]) == dual and (variant == "sd3.5-medium") == bool(dual)
