"""Chroma on one device against its oracles: the adapter equals the diffusers transformer's own forward;
prompts are encoded as ChromaPipeline encodes them; our engine equals ChromaPipeline; the original-layout
file (ComfyUI's own Chroma module, tests/data/comfy_ref_chroma.safetensors) converts as diffusers' converter
does and computes ComfyUI's forward; files are told from Flux's."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families import registry
from parallel_runtime.models.families.chroma.keys import LAYOUT, skeleton
from parallel_runtime.models.families.flux.adapter import image_ids
from parallel_runtime.models.files import read_safetensors_header
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.models.text_encoding import encode_prompt, encode_prompts
from parallel_runtime.parallel.mesh import ParallelMesh

DATA = Path(__file__).resolve().parent / "data"
FILE = DATA / "comfy_ref_chroma.safetensors"
PX, STEPS = 128, 4


@functools.cache
def reference() -> dict:
    return json.loads((DATA / "comfy_chroma_reference.json").read_text(encoding="utf-8"))


def stored(name: str) -> torch.Tensor:
    t = reference()["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


@pytest.fixture(scope="module")
def comps():
    return load_pipeline_components(ensure_tiny_model("tiny-chroma"), "cpu", torch.float32)


@pytest.fixture(scope="module")
def pipe():
    from diffusers import ChromaPipeline

    return ChromaPipeline.from_pretrained(ensure_tiny_model("tiny-chroma"), torch_dtype=torch.float32)


def forward(adapter, x, sigma, cond, guidance=None) -> torch.Tensor:
    mesh = ParallelMesh.single()
    with torch.no_grad():
        return adapter.forward(x, sigma, cond, mesh, SequenceParallelAttention(mesh, "sdpa"), guidance=guidance)


@torch.no_grad()
def test_adapter_equals_the_transformers_forward_with_and_without_a_mask(comps):
    """embed -> blocks -> output on one rank is ChromaTransformer2DModel.forward (guidance 0, as diffusers
    feeds it), also for a batch whose shorter prompt's padding is masked."""
    adapter, t = comps.adapter(), comps.transformer
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 6, 10, generator=g)
    text = torch.randn(2, 9, 32, generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    ids = image_ids(3, 5)
    for m in (None, mask):
        ours = adapter.patchify(forward(adapter, x, torch.tensor([0.4, 0.4]), Conditioning(text, None, m)))
        ref = t(
            hidden_states=adapter.patchify(x),
            encoder_hidden_states=text,
            timestep=torch.tensor([0.4, 0.4]),
            img_ids=ids,
            txt_ids=torch.zeros(9, 3),
            attention_mask=None if m is None else torch.cat([m.bool(), torch.ones(2, 15, dtype=torch.bool)], 1),
        ).sample
        assert (ours - ref).abs().max().item() <= 1e-5
    # the mask matters (a test that would pass without it proves nothing) and trailing padding is dropped exactly
    unmasked = forward(adapter, x, 0.4, Conditioning(text, None, None))
    masked = forward(adapter, x, 0.4, Conditioning(text, None, mask))
    assert (unmasked[1] - masked[1]).abs().max() > 1e-3 and torch.equal(unmasked[0], masked[0])
    cut = forward(adapter, x[1:], 0.4, Conditioning(text[1:, :5], None, None))
    assert (cut - masked[1:]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("prompts", [["a red fox in the snow"], [""], ["a cat", "a photo of a cat on a red chair"]])
def test_text_is_chroma_pipelines_up_to_its_first_padding_token(comps, pipe, prompts):
    ours = encode_prompt(comps, "chroma", prompts)
    with torch.no_grad():
        embeds, mask = pipe._get_t5_prompt_embeds(prompts, device="cpu")
    length = int(mask.sum(dim=1).max())
    assert length < 512 and not mask[:, length:].any()  # the pipeline masks everything after this
    assert ours.prompt_embeds.shape[1] == length
    assert (ours.prompt_embeds - embeds[:, :length]).abs().max().item() <= 1e-6
    if bool(mask[:, :length].all()):
        assert ours.attention_mask is None
    else:
        assert torch.equal(ours.attention_mask.bool(), mask[:, :length].bool())


@torch.no_grad()
@pytest.mark.parametrize("prompts", [["a red fox"], ["a red fox", "a lighthouse at dusk on a cliff"]])
def test_engine_equals_chroma_pipeline_with_cfg(comps, pipe, prompts):
    """Same weights, prompts, noise and sigmas; the pipeline gets its own 512-token T5 states with the mask
    as a boolean (diffusers 0.42.1's prompt path hands SDPA a 0/1 float mask, which adds instead of
    masking: diffusers issue #12116, fixed by #12263 with this boolean mask)."""
    batch = len(prompts)
    pos_embeds, pos_mask = pipe._get_t5_prompt_embeds(prompts, device="cpu")
    neg_embeds, neg_mask = pipe._get_t5_prompt_embeds(["blurry"] * batch, device="cpu")
    noise = torch.randn(batch, 16, 16, 16, generator=torch.Generator().manual_seed(3))
    packed = pipe._pack_latents(noise, batch, 16, 16, 16)
    out = pipe(
        prompt_embeds=pos_embeds,
        prompt_attention_mask=pos_mask.bool(),
        negative_prompt_embeds=neg_embeds,
        negative_prompt_attention_mask=neg_mask.bool(),
        height=PX,
        width=PX,
        num_inference_steps=STEPS,
        guidance_scale=4.0,
        latents=packed,
        output_type="latent",
    ).images
    ref = pipe._unpack_latents(out, PX, PX, pipe.vae_scale_factor)
    sigmas = pipe.scheduler.sigmas.float()
    pos, neg = encode_prompts(comps, "chroma", prompts, "blurry")
    adapter = comps.adapter()
    settings = SamplingSettings(seed=0, cfg=4.0, sampler="euler", sigmas=sigmas)
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
    assert (ours - ref).abs().max().item() <= 1e-4


def test_the_original_layout_file_is_chroma_and_reads_its_config_from_the_weights():
    shapes = {k: tuple(v["shape"]) for k, v in read_safetensors_header(FILE).items() if k != "__metadata__"}
    assert registry.detect(shapes).id == "chroma"
    info = inspect_single_file(FILE)
    structure = reference()["models"]["chroma"]["structure"]
    assert info.family == "chroma" and info.variant == "chroma1"
    cfg = info.config
    assert (cfg["num_layers"], cfg["num_single_layers"]) == (structure["depth"], structure["depth_single"])
    assert cfg["num_attention_heads"] * cfg["attention_head_dim"] == structure["hidden"]
    assert list(cfg["axes_dims_rope"]) == structure["axes_dim"]
    assert (cfg["approximator_hidden_dim"], cfg["approximator_layers"]) == (48, 2)
    assert skeleton(cfg) == shapes  # LoRA files in this layout are routed through the skeleton
    # a Chroma diffusers folder is Chroma too; Flux files stay Flux
    tiny = ensure_tiny_model("tiny-chroma") / "transformer"
    assert registry.detect(read_safetensors_header(next(tiny.glob("*.safetensors")))).id == "chroma"
    assert registry.detect(["double_blocks.0.img_attn.qkv.weight", "img_in.weight"]).id == "flux"


@torch.no_grad()
def test_the_file_computes_comfyuis_chroma_forward():
    """The file through our single-file path (keys.py's conversion) and the adapter equals one call of
    ComfyUI's own Chroma (its 344-row modulation table, the guidance it embeds)."""
    model, family, _ = load_single_file_transformer(FILE, "cpu", torch.float32)
    from parallel_runtime.models.registry import adapter_class_for

    adapter = adapter_class_for(type(model))(model)
    fwd = reference()["forward"]
    cond = Conditioning(stored(fwd["context"]))
    got = forward(adapter, stored(fwd["x"]), fwd["sigma"], cond, guidance=torch.tensor([fwd["guidance"]]))
    expected = stored(fwd["out"])
    assert ((got - expected).norm() / expected.norm()).item() <= 1e-5
    without = forward(adapter, stored(fwd["x"]), fwd["sigma"], cond, guidance=torch.tensor([0.0]))
    assert ((without - expected).norm() / expected.norm()).item() > 1e-3  # the guidance is embedded


def test_our_conversion_is_diffusers_chroma_converter_at_chroma1_width():
    """diffusers' converter cuts the single blocks at Chroma1's width (3072): on row-probe tensors of a
    1 + 1 block model at that width, ours moves every row where diffusers' does."""
    from diffusers.loaders.single_file_utils import convert_chroma_transformer_checkpoint_to_diffusers

    config = {
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "in_channels": 64,
        "joint_attention_dim": 4096,
        "approximator_num_channels": 64,
        "approximator_hidden_dim": 5120,
        "approximator_layers": 2,
    }
    g = torch.Generator().manual_seed(0)
    original = {k: torch.randn(s[0], *[1] * (len(s) - 1), generator=g) for k, s in skeleton(config).items()}
    theirs = convert_chroma_transformer_checkpoint_to_diffusers(dict(original))
    state = dict(original)
    ours = LAYOUT.to_diffusers(state, config)
    assert not state and sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    from diffusers import ChromaTransformer2DModel

    from parallel_runtime.models.weights import parameters_on_meta

    with parameters_on_meta():
        meta = ChromaTransformer2DModel(**{k: v for k, v in config.items()})
    assert {k: tuple(v.shape[:1]) for k, v in meta.state_dict().items()} == {k: v.shape[:1] for k, v in ours.items()}


def test_guidance_defaults_to_comfyuis_zero_and_flux_keeps_its_own(comps):
    from parallel_runtime.denoise.settings import DEFAULT_FLUX_GUIDANCE, embedded_guidance

    assert embedded_guidance(comps.adapter(), None) == 0.0 and embedded_guidance(comps.adapter(), 3.0) == 3.0
    flux = load_pipeline_components(ensure_tiny_model("tiny-flux"), "cpu", torch.float32, parts=("transformer",))
    assert embedded_guidance(flux.adapter(), None) == DEFAULT_FLUX_GUIDANCE


def test_bench_families_counts_every_weight_of_the_released_config():
    """``bench families``' byte accounting at Chroma1-HD's config equals the parameters of the model built from the
    shipped config (8.9B, as the release states), 2 bytes each; 1024x1024 px is 64 x 64 = 4096 image tokens."""
    from diffusers import ChromaTransformer2DModel

    from parallel_runtime.models.families.registry import family
    from parallel_runtime.models.single_file import shipped_config
    from parallel_runtime.tools.bench_families import default_tokens, weight_gb

    spec, (config, _) = family("chroma"), shipped_config("chroma1")
    with torch.device("meta"):
        params = sum(p.numel() for p in ChromaTransformer2DModel.from_config(config).parameters())
    assert 8.8e9 < params < 9.0e9
    assert weight_gb(spec, "chroma1", "auto")["pp1"] == round(2 * params / 1e9, 3)
    assert default_tokens(spec, "chroma1") == {"size": "1024x1024", "image_tokens": 4096, "sequence_tokens": 4224}
