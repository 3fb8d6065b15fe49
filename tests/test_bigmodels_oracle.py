"""External oracles for Qwen-Image and FLUX.2: diffusers' own pipelines on the same tiny components, and
ComfyUI's own KSampler on tiny Qwen-Image files (stored references, tests/data/comfy_qwen_image_reference.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompt
from parallel_runtime.parallel.mesh import ParallelMesh

DATA = Path(__file__).parent / "data"
STEPS = 4
PX = 128


def _components(name):
    return load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)


def _ours(comps, pos, neg, sigmas, start, cfg, guidance=None):
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    settings = SamplingSettings(seed=0, cfg=cfg, sampler="euler", sigmas=sigmas, guidance=guidance)
    raw = denoise_latent(
        adapter, ParallelMesh.single(), ms, pos, neg, torch.zeros_like(start), settings, start_model_space=start
    )
    return adapter.plan.latent_format.to_model(raw)


@torch.no_grad()
def test_qwen_image_matches_diffusers_qwen_image_pipeline():
    from diffusers import QwenImagePipeline

    comps = _components("tiny-qwen-image")
    pipe = QwenImagePipeline.from_pretrained(ensure_tiny_model("tiny-qwen-image"), torch_dtype=torch.float32)
    pos = encode_prompt(comps, "qwen-image", "a red fox in the snow")
    latent_side = PX // 8
    noise = torch.randn(1, 16, latent_side, latent_side, generator=torch.Generator().manual_seed(3))
    packed = pipe._pack_latents(noise, 1, 16, latent_side, latent_side)
    out = pipe(
        prompt_embeds=pos.prompt_embeds,
        prompt_embeds_mask=torch.ones(pos.prompt_embeds.shape[:2], dtype=torch.long),
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        latents=packed,
        output_type="latent",
    ).images
    ref = pipe._unpack_latents(out, PX, PX, pipe.vae_scale_factor)[:, :, 0]
    sigmas = pipe.scheduler.sigmas.float()
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and sigmas.numel() == STEPS + 1
    ours = _ours(comps, pos, None, sigmas, noise, cfg=1.0)
    assert (ours - ref).abs().max().item() <= 1e-4


@torch.no_grad()
def test_flux2_matches_diffusers_flux2_pipeline():
    from diffusers import Flux2Pipeline

    comps = _components("tiny-flux2")
    pipe = Flux2Pipeline.from_pretrained(ensure_tiny_model("tiny-flux2"), torch_dtype=torch.float32)
    pos = encode_prompt(comps, "flux2", "a lighthouse at dusk")
    side = PX // 16
    noise = torch.randn(1, 16, side, side, generator=torch.Generator().manual_seed(4))  # packed 128-style latent
    out = pipe(
        prompt_embeds=pos.prompt_embeds,
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=noise,
        output_type="latent",
    ).images
    ref = out.reshape(1, side, side, 16).permute(0, 3, 1, 2)
    sigmas = pipe.scheduler.sigmas.float()
    ours = _ours(comps, pos, None, sigmas, noise, cfg=1.0, guidance=4.0)
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name, family", [("tiny-qwen-image", "qwen-image"), ("tiny-flux2", "flux2")])
@torch.no_grad()
def test_text_encoding_matches_the_pipelines_encode_prompt(name, family):
    import diffusers

    from parallel_runtime.models.families.qwen_image.text import qwen_prefix_tokens

    comps = _components(name)
    pipe_cls = getattr(diffusers, comps.pipeline_class)
    pipe = pipe_cls.from_pretrained(ensure_tiny_model(name), torch_dtype=torch.float32)
    prompts = ["a red fox in the snow", "a photo of a cat sitting on a red chair in the garden, highly detailed"]
    ours = encode_prompt(comps, family, prompts)
    if family == "qwen-image":
        pipe.prompt_template_encode_start_idx = qwen_prefix_tokens(pipe.tokenizer)  # 34 with Qwen's own tokenizer
        ref, mask = pipe.encode_prompt(prompts, device="cpu")
        assert torch.equal(ours.attention_mask, mask) and ours.attention_mask[0].sum() < mask.shape[1]
    else:
        ref, _ = pipe.encode_prompt(prompts, device="cpu")
        assert ours.prompt_embeds.shape == (2, 512, comps.transformer_config["joint_attention_dim"])
    assert torch.equal(ours.prompt_embeds, ref)


# -- ComfyUI's own KSampler on tiny Qwen-Image files -------------------------------------------------
def _tensor(entry) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def _comfy_reference():
    return json.loads((DATA / "comfy_qwen_image_reference.json").read_text(encoding="utf-8"))


def _bf16_transformer(reference):
    from diffusers import QwenImageTransformer2DModel
    from safetensors.torch import load_file

    model = QwenImageTransformer2DModel(**reference["config"])
    state = load_file(DATA / reference["files"]["bf16"]["file"])
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.eval().requires_grad_(False)


@pytest.mark.parametrize("case", ["euler_cfg", "dpmpp_2m_karras_no_cfg_odd_grid", "img2img_denoise"])
@torch.no_grad()
def test_qwen_image_equals_comfyui_ksampler(case):
    from parallel_runtime.models import Conditioning, get_adapter

    reference = _comfy_reference()
    entry = next(c for c in reference["cases"] if c["name"] == case)
    adapter = get_adapter(_bf16_transformer(reference))
    conds = {k: _tensor(v) for k, v in reference["conditioning"].items()}
    expected = _tensor(entry["samples"])[:, :, 0]  # ComfyUI's Qwen-Image LATENT is [B, 16, 1, H, W]
    shape = entry["latent_shape"]
    latent = _tensor(entry["latent"])[:, :, 0] if "latent" in entry else torch.zeros(shape[0], shape[1], *shape[-2:])
    settings = SamplingSettings(
        seed=entry["seed"],
        steps=entry["steps"],
        cfg=entry["cfg"],
        sampler=entry["sampler"],
        scheduler=entry["scheduler"],
        denoise=entry["denoise"],
    )
    h, w = latent.shape[-2:]
    ms = model_sampling_for(adapter)
    positive = Conditioning(conds[entry["positive"]])
    negative = Conditioning(conds[entry["negative"]])
    got = denoise_latent(adapter, ParallelMesh.single(), ms, positive, negative, latent, settings)
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


def test_big_text_encoders_are_spread_over_gpus_by_layers():
    from parallel_runtime.service.load_job import text_encoder_placement

    gib = 1024**3
    four = ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    mistral = text_encoder_placement({"text_encoder": 48 * gib}, four, dict.fromkeys(four, 20 * gib))
    assert mistral == {"text_encoder": dict.fromkeys(four, 20 * gib)}  # FLUX.2's 24B on 24 GB cards: by layers
    small = text_encoder_placement(
        {"text_encoder": 9 * gib, "text_encoder_2": gib}, four[:2], dict.fromkeys(four[:2], 20 * gib)
    )
    assert small == {"text_encoder": "cuda:0", "text_encoder_2": "cuda:1"}  # whole encoders where they fit
    assert text_encoder_placement({"text_encoder": 48 * gib}, ["cpu", "cpu"], {}) == {"text_encoder": "cpu"}


@torch.no_grad()
def test_flux2_text_model_keeps_only_the_layers_it_reads(tmp_path):
    """FLUX.2 reads Mistral's hidden states 10, 20 and 30: a 34-layer encoder is loaded with 31 layers and
    encodes exactly as the whole one."""
    from transformers import Mistral3ForConditionalGeneration

    from dit_devtools.tiny import big as tiny_big
    from parallel_runtime.models.families.flux2.text import encode_flux2
    from parallel_runtime.models.loading import text_encoder_options

    tok = tiny_big.build_mistral_tokenizer()
    tiny_big.MISTRAL_LAYERS, layers = 34, tiny_big.MISTRAL_LAYERS
    try:
        whole = tiny_big.mistral_text_encoder(tok)
    finally:
        tiny_big.MISTRAL_LAYERS = layers
    whole.save_pretrained(tmp_path / "text_encoder")
    kept = Mistral3ForConditionalGeneration.from_pretrained(
        tmp_path / "text_encoder", local_files_only=True, **text_encoder_options("flux2", tmp_path / "text_encoder")
    ).eval()
    assert len(kept.model.language_model.layers) == 31 < len(whole.model.language_model.layers)
    prompts = ["a lighthouse at dusk"]
    assert torch.equal(encode_flux2(kept, tok, prompts).prompt_embeds, encode_flux2(whole, tok, prompts).prompt_embeds)
