"""Z-Image on one device against its oracles: the adapter equals ZImageTransformer2DModel's own forward (pad tokens
of both sequences included), our prompts equal ZImagePipeline.encode_prompt, our engine equals ZImagePipeline (with
and without CFG), and the defaults ComfyUI derives (model sampling, latent format) are the release's."""

from __future__ import annotations

import contextlib

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.z_image.adapter import SEQ_MULTIPLE
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompt, encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh

torch.set_num_threads(1)
NAME = "tiny-z-image"
SINGLE = ParallelMesh.single()
LONG = ", ".join(["a photo of a cat sitting on a red chair in the garden"] * 20)


class _Plain:
    """Attention as it is: F.scaled_dot_product_attention on one device."""

    def intercept(self):
        return contextlib.nullcontext()


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32)


@pytest.fixture(scope="module")
def pipe():
    from diffusers import ZImagePipeline

    return ZImagePipeline.from_pretrained(ensure_tiny_model(NAME), torch_dtype=torch.float32)


def _reference(transformer, x, sigma, texts):
    """ZImageTransformer2DModel's forward as ZImagePipeline calls it (time 1 - sigma, per-item lists), negated as
    the pipeline (and ComfyUI) negate it."""
    with torch.no_grad():
        out = transformer(list(x.unsqueeze(2)), 1 - sigma, list(texts), return_dict=False)[0]
    return -torch.stack(out)[:, :, 0]


@pytest.mark.parametrize("rows, cols", [(16, 16), (12, 10), (26, 42)], ids=["no-pads", "2-image-pads", "odd-grid"])
def test_adapter_equals_the_transformer_forward(comps, rows, cols):
    """Image tokens (8x8: none; 6x5 and 21x13: 2 and 15 pad tokens) and captions (7 and 22 tokens: padded to 32)."""
    adapter = comps.adapter()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, rows, cols, generator=g)
    sigma = torch.tensor([0.9, 0.35])
    for length in (7, 22):
        text = torch.randn(2, length, 16, generator=g)
        with torch.no_grad():
            ours = adapter.forward(x, sigma, Conditioning(text), SINGLE, _Plain())
        expected = _reference(comps.transformer, x, sigma, text)
        assert (ours - expected).abs().max().item() <= 1e-5, (rows, cols, length)


def test_masked_batch_pads_each_caption_and_refuses_different_padded_lengths(comps):
    """A batch of prompts of 20 and 12 tokens (both pad to 32) equals each prompt alone; 40 and 12 cannot share a
    batch without an attention mask, which is refused with a fix."""
    adapter = comps.adapter()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 12, 10, generator=g)
    sigma = torch.tensor([0.6, 0.6])
    text = torch.randn(2, 20, 16, generator=g)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 12:] = 0
    with torch.no_grad():
        ours = adapter.forward(x, sigma, Conditioning(text, None, mask), SINGLE, _Plain())
    expected = _reference(comps.transformer, x, sigma, [text[0], text[1, :12]])
    assert (ours - expected).abs().max().item() <= 1e-5
    long = torch.randn(2, 40, 16, generator=g)
    long_mask = torch.ones(2, 40, dtype=torch.long)
    long_mask[1, 12:] = 0
    with pytest.raises(ConfigError, match="multiple of 32") as info:
        adapter.forward(x, sigma, Conditioning(long, None, long_mask), SINGLE, _Plain())
    assert "fix:" in str(info.value)
    with pytest.raises(ConfigError, match="2560|16 wide|takes 16"):
        adapter.forward(x, sigma, Conditioning(torch.randn(2, 7, 24)), SINGLE, _Plain())


@pytest.mark.parametrize("prompt", ["a red fox in the snow", "", LONG], ids=["normal", "empty", "long"])
def test_text_encoding_equals_the_pipelines_encode_prompt(comps, pipe, prompt):
    with torch.no_grad():
        ref, _ = pipe.encode_prompt(prompt, device="cpu", do_classifier_free_guidance=False)
    ours = encode_prompt(comps, "z-image", prompt)
    assert ours.attention_mask is None and ours.pooled is None
    assert ours.prompt_embeds.shape == (1, *ref[0].shape)
    assert (ours.prompt_embeds[0] - ref[0]).abs().max().item() <= 1e-6  # the pipeline pads to 512 tokens first


def test_a_batch_of_prompts_is_padded_with_a_mask_and_equals_each_prompt(comps):
    both = encode_prompt(comps, "z-image", ["a red fox", "a lighthouse at dusk on a rocky shore"])
    short = encode_prompt(comps, "z-image", "a red fox")
    n = short.prompt_embeds.shape[1]
    assert both.attention_mask is not None and both.attention_mask[0].sum() == n and both.attention_mask[1].all()
    assert (both.prompt_embeds[0, :n] - short.prompt_embeds[0]).abs().max().item() <= 1e-6


def _ours(comps, pos, neg, sigmas, noise, cfg):
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=cfg, sampler="euler", sigmas=sigmas)
    with torch.no_grad():
        ms = model_sampling_for(adapter)
        raw = denoise_latent(adapter, SINGLE, ms, pos, neg, torch.zeros_like(noise), settings, start_model_space=noise)
    return adapter.plan.latent_format.to_model(raw)


@pytest.mark.parametrize("guidance", [0.0, 3.0], ids=["turbo-no-cfg", "cfg"])
def test_engine_equals_the_z_image_pipeline(comps, pipe, guidance):
    """ZImagePipeline's guidance g is pos + g (pos - neg): ComfyUI's cfg 1 + g. 96 x 80 px: 30 image tokens
    (2 pads); the prompt and the negative pad to different caption lengths."""
    pos, neg = encode_prompts(comps, "z-image", "a red fox in the snow", LONG)
    assert pos.prompt_embeds.shape[1] < SEQ_MULTIPLE < neg.prompt_embeds.shape[1]
    noise = torch.randn(1, 16, 12, 10, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = pipe(
            prompt_embeds=[pos.prompt_embeds[0]],
            negative_prompt_embeds=[neg.prompt_embeds[0]],
            height=96,
            width=80,
            num_inference_steps=4,
            guidance_scale=guidance,
            latents=noise,
            output_type="latent",
        ).images
    sigmas = pipe.scheduler.sigmas.float()
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and sigmas.numel() == 5
    ours = _ours(comps, pos, neg if guidance else None, sigmas, noise, 1.0 + guidance)
    assert (ours - ref).abs().max().item() <= 1e-4


def test_defaults_are_the_releases(comps):
    """ComfyUI 0.3.64 has no Z-Image: the defaults are the release's (scheduler shift 3.0, no dynamic shifting; the
    Flux VAE's scale and shift), which later ComfyUI's ZImage (shift 3.0, multiplier 1.0, latent_formats.Flux)
    states too."""
    plan = comps.adapter().plan
    scheduler = comps.scheduler_config
    assert scheduler["shift"] == 3.0 and not scheduler["use_dynamic_shifting"]
    ms = plan.model_sampling
    assert (ms.kind, ms.shift, ms.multiplier) == ("discrete_flow", scheduler["shift"], 1.0)
    vae = comps.vae.config
    fmt = plan.latent_format
    assert (fmt.channels, fmt.scale, fmt.shift) == (16, vae.scaling_factor, vae.shift_factor) == (16, 0.3611, 0.1159)
    sizes = comps.adapter().config_sizes(comps.transformer_config)
    assert (sizes.heads, sizes.head_dim, sizes.blocks, sizes.text_dim) == (2, 16, 3, 16)


def test_bench_families_counts_every_weight_of_the_released_config():
    """``bench families``' byte accounting at the real config equals the parameters of the model built from the
    shipped config (6.15B, as the release states), 2 bytes each; 1024x1024 px is 64 x 64 = 4096 image tokens."""
    from diffusers import ZImageTransformer2DModel

    from parallel_runtime.models.families.registry import family
    from parallel_runtime.models.single_file import shipped_config
    from parallel_runtime.tools.bench_families import default_tokens, weight_gb

    spec, (config, _) = family("z-image"), shipped_config("z-image-6b")
    with torch.device("meta"):
        params = sum(p.numel() for p in ZImageTransformer2DModel.from_config(config).parameters())
    assert 6.1e9 < params < 6.2e9
    assert weight_gb(spec, "z-image-6b", "auto")["pp1"] == round(2 * params / 1e9, 3)
    assert default_tokens(spec, "z-image-6b") == {"size": "1024x1024", "image_tokens": 4096, "sequence_tokens": 4352}
