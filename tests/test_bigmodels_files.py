"""Qwen-Image and FLUX.2 single files (original layouts, bf16 and fp8) through the real loader: the same
transformer as the folders, ComfyUI's own KSampler results on its files, fp8 storage equal to the same
upcast weights, and PipeFusion stages reading only their share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bigmodel_files import flux2_to_bfl, save, to_fp8

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models import Conditioning, get_adapter
from parallel_runtime.models.fp8 import Fp8Linear, dequantise_model, fp8_layers
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "comfy_qwen_image_reference.json").read_text(encoding="utf-8"))
FILES = {name: DATA / entry["file"] for name, entry in REFERENCE["files"].items()}


def _tensor(entry) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


@pytest.fixture(scope="module")
def flux2_state():
    comps = load_pipeline_components(ensure_tiny_model("tiny-flux2"), "cpu", torch.float32, parts=("transformer",))
    return comps.transformer, {k: v.clone() for k, v in comps.transformer.state_dict().items()}


@pytest.mark.parametrize("case", [c["name"] for c in REFERENCE["cases"]])
@torch.no_grad()
def test_qwen_image_files_equal_comfyui_ksampler(case):
    """bf16, fp8 e4m3fn and fp8-scaled files, loaded as ComfyUI users keep them, sample as ComfyUI does."""
    entry = next(c for c in REFERENCE["cases"] if c["name"] == case)
    model, family, _ = load_single_file_transformer(FILES[entry["file"]], "cpu", torch.float32)
    assert family == "qwen-image"
    assert bool(fp8_layers(model)) == (entry["file"] != "bf16")  # fp8 files keep fp8 storage
    adapter = get_adapter(model)
    conds = {k: _tensor(v) for k, v in REFERENCE["conditioning"].items()}
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
    ms = model_sampling_for(adapter)
    pos, neg = Conditioning(conds[entry["positive"]]), Conditioning(conds[entry["negative"]])
    got = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings)
    expected = _tensor(entry["samples"])[:, :, 0]
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


def test_qwen_image_file_detection_reads_the_sizes():
    info = inspect_single_file(FILES["fp8_scaled"])
    assert (info.family, info.variant) == ("qwen-image", "qwen-image")
    cfg = info.config
    assert (cfg["num_layers"], cfg["num_attention_heads"], cfg["attention_head_dim"]) == (3, 2, 16)
    assert (cfg["joint_attention_dim"], cfg["in_channels"], cfg["out_channels"]) == (24, 64, 16)
    assert cfg["axes_dims_rope"] == [4, 6, 6]


def test_flux2_original_layout_file_loads_the_same_transformer(tmp_path, flux2_state):
    folder_model, state = flux2_state
    path = save(flux2_to_bfl(state), tmp_path / "flux2-dev.safetensors", prefix="model.diffusion_model.")
    info = inspect_single_file(path)
    assert (info.family, info.variant, info.config["num_single_layers"]) == ("flux2", "flux2-dev", 2)
    model, family, _ = load_single_file_transformer(path, "cpu", torch.float32)
    loaded = model.state_dict()
    assert family == "flux2" and set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def _flux2_forward(model, dtype):
    adapter = get_adapter(model)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, adapter.plan.latent_channels, 6, 8, generator=gen)
    cond = Conditioning(torch.randn(1, 20, model.config.joint_attention_dim, generator=gen))
    from parallel_runtime.attention.usp import SequenceParallelAttention

    mesh = ParallelMesh.single()
    with torch.no_grad():
        return adapter.forward(
            x.to(dtype), torch.tensor([0.6]), cond, mesh, SequenceParallelAttention(mesh), guidance=4.0
        )


@pytest.mark.parametrize("kind", ["plain", "scaled", "comfy_quant"])
def test_fp8_storage_equals_the_same_upcast_weights_in_bf16(tmp_path, flux2_state, kind):
    _, state = flux2_state
    path = save(to_fp8(flux2_to_bfl(state), kind), tmp_path / f"flux2_dev_fp8_{kind}.safetensors")
    fp8_model, _, _ = load_single_file_transformer(path, "cpu", torch.bfloat16)
    layers = fp8_layers(fp8_model)
    assert layers and all(layer.weight.dtype == torch.float8_e4m3fn for layer in layers.values())
    assert all(layer.scaled == (kind != "plain") for layer in layers.values())
    # the q/k/v split of a fused fp8 weight keeps that weight's one scale
    q = layers["transformer_blocks.0.attn.to_q"]
    assert q.weight_scale == layers["transformer_blocks.0.attn.to_v"].weight_scale
    reference = dequantise_model(load_single_file_transformer(path, "cpu", torch.bfloat16)[0], torch.bfloat16)
    assert not fp8_layers(reference)
    assert torch.equal(_flux2_forward(fp8_model, torch.bfloat16), _flux2_forward(reference, torch.bfloat16))
    converted, _, _ = load_single_file_transformer(path, "cpu", torch.bfloat16, storage="compute")
    assert not fp8_layers(converted)
    assert torch.equal(
        converted.state_dict()["transformer_blocks.0.attn.to_q.weight"],
        reference.transformer_blocks[0].attn.to_q.weight,
    )


def test_fp8_stage_reads_only_its_share(tmp_path, flux2_state):
    _, state = flux2_state
    path = save(to_fp8(flux2_to_bfl(state), "scaled"), tmp_path / "flux2_dev_fp8_scaled.safetensors")
    held = []
    for stage in (0, 1):
        comps, stages, weights = load_single_file_stage(path, 2, stage, "cpu", torch.bfloat16)
        model = comps.transformer
        real = {n for n, p in model.named_parameters() if p.device.type != "meta"}
        mine = [f"{name}.{j}." for name, j in _blocks(model)][stages.bounds[stage] : stages.bounds[stage + 1]]
        assert all(
            n.startswith(tuple(mine)) or not n.startswith(("transformer_blocks.", "single_transformer")) for n in real
        )
        assert any(isinstance(m, Fp8Linear) and m.weight.device.type != "meta" for m in model.modules())
        held.append(weights.param_bytes)
        assert weights.param_bytes == sum(
            p.numel() * p.element_size() for n, p in model.named_parameters() if n in real
        )
    assert sum(held) < weights.total_transformer_bytes + 1  # together the stages hold the model once


def _blocks(model):
    return [
        (name, j)
        for name in ("transformer_blocks", "single_transformer_blocks")
        for j in range(len(getattr(model, name)))
    ]


@pytest.mark.parametrize("layout", ["ulysses2", "pp2"])
def test_fp8_scaled_file_on_the_pool_equals_comfyui(cpu_pool, layout):
    """The ComfyUI fp8-scaled file, loaded by every rank (PipeFusion: each stage its share, fp8 kept), gives
    ComfyUI's KSampler result."""
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import generate

    entry = next(c for c in REFERENCE["cases"] if c["name"] == "fp8_scaled_euler_cfg")
    config = ParallelConfig(ulysses=2) if layout == "ulysses2" else ParallelConfig(pp=2)
    pool = cpu_pool(config)
    info = pool.submit(load_model, str(FILES["fp8_scaled"]), "fp32", "sdpa").result(300)
    assert info["family"] == "qwen-image"
    conds = {k: _tensor(v) for k, v in REFERENCE["conditioning"].items()}
    shape = entry["latent_shape"]
    settings = SamplingSettings(seed=entry["seed"], steps=entry["steps"], cfg=entry["cfg"], sampler=entry["sampler"])
    extra = dict(patches=2, warmup=entry["steps"]) if layout == "pp2" else {}
    latent = torch.zeros(shape[0], shape[1], *shape[-2:])
    pos, neg = Conditioning(conds[entry["positive"]]), Conditioning(conds[entry["negative"]])
    got = pool.submit(generate, pos, neg, latent, settings, **extra).result(300)
    expected = _tensor(entry["samples"])[:, :, 0]
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


def test_flux2_file_with_its_vae_file_decodes_like_the_folder(cpu_pool, tmp_path, flux2_state):
    """flux2-dev.safetensors (BFL layout) + flux2-vae.safetensors (LDM layout + batch-norm statistics) from
    ComfyUI's folders: the same latent and the same decoded image as the diffusers folder, on Ulysses 2."""
    from ldm_vae_layout import to_ldm
    from safetensors.torch import save_file

    from parallel_runtime.denoise.settings import SamplingSettings
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import decode, generate

    _, state = flux2_state
    transformer = save(flux2_to_bfl(state), tmp_path / "flux2-dev.safetensors")
    folder = ensure_tiny_model("tiny-flux2")
    vae = load_pipeline_components(folder, "cpu", torch.float32, parts=("vae",)).vae
    vae_state = {k: v for k, v in vae.state_dict().items() if not k.startswith("bn.")}
    ldm = to_ldm(vae_state, len(vae.config.block_out_channels))
    ldm.update({k: v for k, v in vae.state_dict().items() if k in ("bn.running_mean", "bn.running_var")})
    vae_file = tmp_path / "flux2-vae.safetensors"
    save_file(ldm, str(vae_file))
    pool = cpu_pool(ParallelConfig(ulysses=2))
    gen = torch.Generator().manual_seed(5)
    pos = Conditioning(torch.randn(1, 512, 48, generator=gen))
    latent = torch.zeros(1, 16, 4, 6)
    settings = SamplingSettings(seed=2, steps=2, guidance=4.0)
    pool.submit(load_model, str(folder), "fp32", "sdpa").result(300)
    expected = pool.submit(generate, pos, None, latent, settings).result(300)
    expected_image = pool.submit(decode, expected).result(300)
    pool.submit(load_model, str(transformer), "fp32", "sdpa", vae_path=str(vae_file), vae_norm_groups=4).result(300)
    got = pool.submit(generate, pos, None, latent, settings).result(300)
    assert (got - expected).abs().max().item() <= 1e-5
    torch.testing.assert_close(pool.submit(decode, got).result(300), expected_image, rtol=0, atol=1e-5)


def _comfy_qwen_text_file(tmp_path, fp8: bool = False) -> tuple[Path, Path]:
    """The tiny Qwen2.5-VL of tiny-qwen-image saved as ComfyUI stores qwen_2.5_vl_7b*.safetensors, with its
    tokenizer in a ``<stem>_tokenizer`` folder next to it."""
    comps = load_pipeline_components(ensure_tiny_model("tiny-qwen-image"), "cpu", torch.float32, parts=("text",))
    comfy = {}
    for key, value in comps.text_encoders["text_encoder"].state_dict().items():
        if key.startswith("model.language_model."):
            comfy["model." + key[len("model.language_model.") :]] = value
        elif key.startswith("model.visual."):
            comfy["visual." + key[len("model.visual.") :]] = value
    stem = "qwen_2.5_vl_7b_fp8_scaled" if fp8 else "qwen_2.5_vl_7b"
    path = save(to_fp8(comfy, "scaled") if fp8 else comfy, tmp_path / f"{stem}.safetensors")
    comps.tokenizers["tokenizer"].save_pretrained(tmp_path / f"{stem}_tokenizer")
    return path, tmp_path / f"{stem}_tokenizer"


TINY_QWEN_TEXT = {"head_dim": 12, "rms_norm_eps": 1e-5}  # what the tiny encoder's weights cannot show


def test_qwen_text_encoder_files_encode_like_the_folder(cpu_pool, tmp_path):
    """ComfyUI's Qwen2.5-VL file (bf16; fp8 scaled) on the workers encodes as the diffusers folder's encoder
    (bf16: exactly; fp8: as its own weights upcast at load)."""
    from parallel_runtime.models.families.qwen_image.text import encode_qwen_image
    from parallel_runtime.models.qwen25_text_file import load_qwen25_text_file
    from parallel_runtime.models.text_encoding import encode_prompt
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    folder = ensure_tiny_model("tiny-qwen-image")
    comps = load_pipeline_components(folder, "cpu", torch.float32, parts=("text",))
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(FILES["bf16"]), "fp32", "sdpa").result(300)  # a transformer file: no encoders
    prompts = ["a red fox in the snow", "a lighthouse at dusk"]
    bf16, tokenizer = _comfy_qwen_text_file(tmp_path)
    got = pool.submit(encode_text_file, str(bf16), str(tokenizer), prompts, None, TINY_QWEN_TEXT).result(300)
    for prompt, cond in zip(prompts, got):
        assert torch.equal(cond.prompt_embeds, encode_prompt(comps, "qwen-image", prompt).prompt_embeds)
    fp8, fp8_tokenizer = _comfy_qwen_text_file(tmp_path, fp8=True)
    got = pool.submit(encode_text_file, str(fp8), str(fp8_tokenizer), prompts[:1], None, TINY_QWEN_TEXT).result(300)
    upcast = load_qwen25_text_file(fp8, "cpu", torch.float32, storage="compute", overrides=TINY_QWEN_TEXT)
    expected = encode_qwen_image(upcast, comps.tokenizers["tokenizer"], prompts[:1]).prompt_embeds
    assert torch.equal(got[0].prompt_embeds, expected)
    assert not torch.equal(expected, encode_prompt(comps, "qwen-image", prompts[0]).prompt_embeds)  # fp8 is not bf16
