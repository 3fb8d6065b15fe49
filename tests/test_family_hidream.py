"""HiDream-I1 on one device against its oracles: the adapter equals diffusers' HiDreamImageTransformer2DModel's
own forward (negated: the flow convention here); our engine on one device equals HiDreamImagePipeline on the same
prompt embeddings (CFG, its sigmas); a single file in the release's layout (the tiny transformer's
tensors under ComfyUI's prefix) loads to the same transformer, its config read from the weights; conditioning
without Llama states and prompt encoding on the workers are refused with a way out."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families import registry
from parallel_runtime.models.families.hidream.conditioning import HiDreamText
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.models.text_encoding import encode_prompt
from parallel_runtime.parallel.mesh import ParallelMesh

T5, LLAMA, POOLED, LAYERS = 32, 24, 20, 4


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model("tiny-hidream"), "cpu", torch.float32)


def conditioning(batch: int, t5_tokens: int, llama_tokens: int, seed: int = 0) -> Conditioning:
    g = torch.Generator().manual_seed(seed)
    llama = torch.randn(batch, LAYERS, llama_tokens, LLAMA, generator=g)
    return Conditioning(
        torch.randn(batch, t5_tokens, T5, generator=g),
        torch.randn(batch, POOLED, generator=g),
        None,
        HiDreamText(llama),
    )


def forward(adapter, x, sigma, cond) -> torch.Tensor:
    mesh = ParallelMesh.single()
    with torch.no_grad():
        return adapter.forward(x, sigma * 1000, cond, mesh, SequenceParallelAttention(mesh, "sdpa"))


def diffusers_forward(transformer, x, sigma, cond) -> torch.Tensor:
    with torch.no_grad():
        return transformer(
            hidden_states=x,
            timesteps=torch.full((x.shape[0],), sigma * 1000),
            encoder_hidden_states_t5=cond.prompt_embeds,
            encoder_hidden_states_llama3=cond.extras.llama3.movedim(1, 0),  # diffusers: layer first
            pooled_embeds=cond.pooled,
        ).sample


@pytest.mark.parametrize(("batch", "size", "t5", "llama"), [(1, 8, 7, 5), (2, 12, 4, 9)])
def test_adapter_equals_the_transformers_forward(comps, batch, size, t5, llama):
    """embed -> blocks -> output on one rank is HiDreamImageTransformer2DModel.forward, negated (square latents:
    diffusers pads non-square ones to max_resolution, ComfyUI does not)."""
    adapter, t = comps.adapter(), comps.transformer
    x = torch.randn(batch, 16, size, size, generator=torch.Generator().manual_seed(batch))
    cond = conditioning(batch, t5, llama)
    ours = forward(adapter, x, 0.6, cond)
    ref = diffusers_forward(t, x, 0.6, cond)
    assert ref.abs().max() > 1e-2
    assert (ours + ref).abs().max().item() <= 1e-5
    # every block's own Llama layer matters (a model reading one layer everywhere would pass without this)
    other = cond.extras.llama3.clone()
    other[:, 1] += 1.0
    changed = forward(adapter, x, 0.6, Conditioning(cond.prompt_embeds, cond.pooled, None, HiDreamText(other)))
    assert (changed - ours).abs().max() > 1e-3


@torch.no_grad()
def test_engine_equals_hidream_image_pipeline_with_cfg(comps):
    """Same weights, embeddings, noise and sigmas, CFG 5 on a batch of two: our engine's latent is
    HiDreamImagePipeline's (output_type latent). The pipeline gets the prompt embeddings, not prompts: by design
    we encode HiDream prompts as ComfyUI's QuadrupleCLIPLoader + CLIPTextEncode do (proven against ComfyUI in
    test_family_hidream_text_files) and refuse a folder's encoders, so the pipeline's encode_prompt is not ours;
    both sides start from the same T5 / Llama / pooled tensors. Square latents (the pipeline pads others to max_resolution) at the pipeline's own size rule: its
    default_sample_size is set to the tiny size, so it keeps 64 x 64."""
    from diffusers import HiDreamImagePipeline

    unused = {f"{kind}{n}": None for kind in ("text_encoder", "tokenizer") for n in ("", "_2", "_3", "_4")}
    pipe = HiDreamImagePipeline.from_pretrained(ensure_tiny_model("tiny-hidream"), dtype=torch.float32, **unused)
    pipe.set_progress_bar_config(disable=True)
    pipe.default_sample_size = 8  # its area rule: (8 x 8)^2 pixels, i.e. 64 x 64 kept as asked
    pos, neg = conditioning(2, 7, 5, seed=1), conditioning(2, 7, 5, seed=2)
    noise = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(3))
    ref = pipe(
        prompt_embeds_t5=pos.prompt_embeds,
        prompt_embeds_llama3=pos.extras.llama3.movedim(1, 0),  # diffusers: layer first
        pooled_prompt_embeds=pos.pooled,
        negative_prompt_embeds_t5=neg.prompt_embeds,
        negative_prompt_embeds_llama3=neg.extras.llama3.movedim(1, 0),
        negative_pooled_prompt_embeds=neg.pooled,
        height=64,
        width=64,
        num_inference_steps=3,
        guidance_scale=5.0,
        latents=noise.clone(),
        output_type="latent",
    ).images
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=5.0, sampler="euler", sigmas=pipe.scheduler.sigmas.float())
    raw = denoise_latent(
        adapter,
        ParallelMesh.single(),
        model_sampling_for(adapter),
        pos,
        neg,
        torch.zeros_like(noise),
        settings,
        start_model_space=noise,
    )
    ours = adapter.plan.latent_format.to_model(raw)
    error = (ours - ref).abs().max().item()
    print(f"HiDream engine vs HiDreamImagePipeline: max |err| {error:.2e} (latent max {ref.abs().max():.2f})")
    assert ref.shape == (2, 16, 8, 8) and (ref - noise).abs().max() > 0.1
    assert error <= 1e-4


def test_the_release_file_loads_to_the_same_transformer(comps, tmp_path):
    """A single file as ComfyUI users have it (model.diffusion_model.<diffusers name>) is detected as HiDream;
    its config (blocks, width, experts, text widths, the narrow head rule) is the tiny model's."""
    from safetensors.torch import save_file

    t = comps.transformer
    path = tmp_path / "hidream_i1_tiny.safetensors"
    save_file({f"model.diffusion_model.{k}": v.to(torch.bfloat16) for k, v in t.state_dict().items()}, str(path))
    info = inspect_single_file(path)
    assert (info.family, info.variant) == ("hidream-i1", "hidream-i1-17b")
    for key in ("num_layers", "num_single_layers", "num_attention_heads", "attention_head_dim", "caption_channels",
                "text_emb_dim", "num_routed_experts", "llama_layers", "in_channels", "axes_dims_rope"):  # fmt: skip
        assert (
            list(info.config[key]) == list(t.config[key])
            if isinstance(t.config[key], (list, tuple))
            else (info.config[key] == t.config[key])
        ), key
    loaded, family, _ = load_single_file_transformer(path, "cpu", torch.float32)
    assert family == "hidream-i1"
    ref = {k: v.to(torch.bfloat16).float() for k, v in t.state_dict().items()}
    assert all(torch.equal(v, ref[k]) for k, v in loaded.state_dict().items())


def test_published_config_is_read_from_published_shapes():
    """The shipped config's shapes (20 x 128 wide, 16 + 32 blocks) give back the published config."""
    from parallel_runtime.models.families.hidream.keys import config_from_weights
    from parallel_runtime.models.single_file import shipped_config

    base, scheduler = shipped_config("hidream-i1-17b")
    from diffusers import HiDreamImageTransformer2DModel

    with torch.device("meta"):
        model = HiDreamImageTransformer2DModel.from_config(base)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = config_from_weights(shapes, base)
    assert got["llama_layers"] == base["llama_layers"] and got["axes_dims_rope"] == base["axes_dims_rope"]
    assert {k: v for k, v in got.items() if k in base} == {k: base[k] for k in got}


def test_missing_llama_states_and_worker_text_encoding_are_refused(comps):
    adapter = comps.adapter()
    x = torch.zeros(1, 16, 8, 8)
    with pytest.raises(ConfigError, match="Llama-3.1"):
        forward(adapter, x, 0.5, Conditioning(torch.zeros(1, 3, T5), torch.zeros(1, POOLED)))
    with pytest.raises(ConfigError, match="QuadrupleCLIPLoader"):
        registry.family("hidream-i1").text_encoding().encode(comps, ["a cat"], 128, torch.device("cpu"))
    with pytest.raises(ConfigError):  # the tiny folder has no encoders: refused before that
        encode_prompt(comps, "hidream-i1", ["a cat"])
    assert registry.family("hidream-i1").comfy_conditioning.keys[0] == "conditioning_llama3"
    # Parallel Text Encode (the model's own encoders) is refused on the host, before any job; others still pass
    from parallel_runtime.service.host_checks import text_encoder_files

    with pytest.raises(ConfigError, match="QuadrupleCLIPLoader") as info:
        text_encoder_files("hidream-i1", None, None)
    assert "Parallel Sampler" in str(info.value)
    assert text_encoder_files("chroma", None, None) is None


def test_pipefusion_ends_load_only_their_layers():
    """The shape trace (models.extra_roles, no Llama states) finds the first stage's embedders and caption
    projections (1 GB at the real size) and leaves the last stage only the output layer."""
    from diffusers import HiDreamImageTransformer2DModel

    from parallel_runtime.models.extra_roles import trace_extra_roles
    from parallel_runtime.models.single_file import shipped_config

    base, _ = shipped_config("hidream-i1-17b")
    roles = trace_extra_roles(HiDreamImageTransformer2DModel, base)
    assert roles.traced and {n.split(".")[0] for n in roles.final} == {"final_layer"}
    assert {f"caption_projection.{i}.linear.weight" for i in range(49)} <= roles.embed
