"""HunyuanVideo 1.0 against ComfyUI's own code, on one device: the outputs stored by
tests/data/make_comfy_hunyuan_video_reference.py (ComfyUI 0.3.64 loading tiny Tencent-layout files and running
KSampler on EmptyHunyuanLatentVideo and HunyuanImageToVideo "v1 (concat)" inputs, FluxGuidance, CONDITIONING
tensors given directly; its 3-D VAE decoding a latent) equal our engine on the same files, loaded through our
single-file and VAE-file loaders, to 1e-4 relative (L2); and the single-file layout's facts (detection, config,
variant, a conversion that only renames and cuts rows, the skeleton)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.conversion_plan import plan_conversion
from parallel_runtime.models.families.hunyuan_video import I2V_CONCAT, T2V
from parallel_runtime.models.families.hunyuan_video.conditioning import HunyuanImageInputs
from parallel_runtime.models.families.hunyuan_video.keys import LAYOUT
from parallel_runtime.models.families.hunyuan_video.latent import HUNYUAN_VIDEO
from parallel_runtime.models.families.hunyuan_video.vae_bands import COMFY_ATTENTION
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.vae.decode import decode_to_image_tensor
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from hunyuan_video_tiny_weights import TinyHunyuanVideo, tiny_hunyuan_video_state_dict, vae_weight  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_hunyuan_video_reference.json").read_text())
TOLERANCE = 1e-4
IMAGE_TOL = 2e-5  # IMAGE values in 0..1


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"], recipe.get("offset", 0.0))
    assert state_digest({"t": t}) == recipe["digest"], f"{recipe['name']} is not what the reference was made from"
    return t


def conditioning(recipe: dict, extras=None) -> Conditioning:
    """The CONDITIONING tensors the reference gave ComfyUI: Llama states and CLIP-L's pooled output."""
    return Conditioning(generated(recipe["llama"]), generated(recipe["pooled"]), extras=extras)


def write_transformer(folder: Path, info: dict, prefix: str = "") -> Path:
    from safetensors.torch import save_file

    state = tiny_hunyuan_video_state_dict(TinyHunyuanVideo(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny HunyuanVideo weights differ from the reference's"
    path = folder / f"hunyuan_video_{info['salt']}{'_ckpt' if prefix else ''}.safetensors"
    save_file({prefix + k: v for k, v in state.items()}, str(path))
    return path


def write_vae(folder: Path) -> Path:
    from safetensors.torch import save_file

    path = folder / "hunyuan_video_vae.safetensors"
    save_file({k: vae_weight(k, tuple(s)) for k, s in REF["vae"]["tensors"].items()}, str(path))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("comfy-hunyuan-video")
    return {
        "t2v": write_transformer(folder, REF["t2v"]["model"]),
        "i2v": write_transformer(folder, REF["i2v"]["model"], "model.diffusion_model."),  # inside a checkpoint
        "vae": write_vae(folder),
    }


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err <= TOLERANCE, f"relative L2 error {err:.2e} against ComfyUI"


def t2v_inputs(run: dict):
    case = REF["t2v"]
    settings = SamplingSettings(
        seed=run["seed"], steps=run["steps"], cfg=run["cfg"], sampler=run["sampler"], scheduler=run["scheduler"]
    )
    positive = (CondEntry(conditioning(case["positive"]), guidance=run["guidance"]),)
    return positive, conditioning(case["negative"]), tensor(case["latent"]), settings


def i2v_inputs():
    case = REF["i2v"]
    extras = HunyuanImageInputs(tensor(case["concat_latent_image"]), tensor(case["concat_mask"]))
    settings = SamplingSettings(
        seed=case["seed"], steps=case["steps"], cfg=case["cfg"], sampler=case["sampler"], scheduler=case["scheduler"]
    )
    return conditioning(case["positive"], extras), conditioning(case["negative"]), tensor(case["latent"]), settings


@pytest.mark.parametrize("index", [0, 1], ids=["euler-guidance6", "euler_ancestral-cfg3-fluxguidance"])
def test_text_to_video_equals_comfyui_ksampler(files, index):
    comps = load_single_file_components(files["t2v"], "cpu", torch.float32)
    adapter = comps.adapter()
    ms = model_sampling_for(adapter)
    assert ms.shift == REF["t2v"]["model"]["comfy_shift"] and adapter.plan.default_guidance == 6.0
    run = REF["t2v"]["runs"][index]
    positive, negative, latent, settings = t2v_inputs(run)
    out = denoise_latent(adapter, ParallelMesh.single(), ms, positive, negative, latent, settings)
    close(out, tensor(run["output"]))


def test_image_to_video_equals_comfyui_hunyuan_image_to_video(files):
    comps = load_single_file_components(files["i2v"], "cpu", torch.float32)
    adapter = comps.adapter()
    positive, negative, latent, settings = i2v_inputs()
    out = denoise_latent(
        adapter, ParallelMesh.single(), model_sampling_for(adapter), positive, negative, latent, settings
    )
    close(out, tensor(REF["i2v"]["output"]))


def test_vae_file_decodes_as_comfyui(files):
    info = inspect_vae_file(files["vae"])
    assert info.layout == "hunyuan-video" and info.latent_channels == 16
    assert info.config["block_out_channels"] == [32, 32, 64, 64] and info.config["layers_per_block"] == 1
    vae = load_vae_file(files["vae"])
    spec = REF["vae"]["latent"]
    z = hashed_uniform(spec["name"], tuple(spec["shape"]), spec["scale"])
    image = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    expected = tensor(REF["vae"]["image"])
    assert image.shape == (9, 40, 48, 3)
    torch.testing.assert_close(image, expected, atol=IMAGE_TOL, rtol=0)
    # the same weights decoded as diffusers decodes them (frame-causal mid-block attention): not ComfyUI's picture
    delattr(vae, COMFY_ATTENTION)
    causal = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    with torch.no_grad():
        own = ((vae.decode(z).sample + 1) / 2).clamp(0, 1)[0].movedim(0, -1)
    torch.testing.assert_close(causal, own, atol=1e-5, rtol=0)
    assert (causal - expected).abs().max() > 1e-3


def test_single_file_facts(files):
    """Detection (Flux-like block names, higher priority), what the weights decide, the variant, a conversion
    that only renames and cuts rows (PipeFusion stages read just their rows), the skeleton for LoRA routing."""
    t2v = inspect_single_file(files["t2v"])
    assert (t2v.family, t2v.variant, t2v.prefix) == ("hunyuan-video", T2V, "")
    config = t2v.config
    assert config["num_attention_heads"] == 2 and config["attention_head_dim"] == 128
    assert config["rope_axes_dim"] == [16, 56, 56] and config["guidance_embeds"] is True
    assert (config["num_layers"], config["num_single_layers"], config["text_embed_dim"]) == (1, 1, 32)
    i2v = inspect_single_file(files["i2v"])
    assert (i2v.variant, i2v.prefix) == (I2V_CONCAT, "model.diffusion_model.")
    assert i2v.config["in_channels"] == 33 and i2v.config["image_condition_type"] == "latent_concat"
    assert not i2v.config["guidance_embeds"]
    shapes = {k: tuple(v.shape) for k, v in tiny_hunyuan_video_state_dict(TinyHunyuanVideo()).items()}
    plan = plan_conversion(lambda state: LAYOUT.to_diffusers(state, config), shapes)
    assert not plan.unused
    comps = load_single_file_components(files["t2v"], "cpu", torch.float32)
    params = dict(comps.transformer.state_dict())
    assert set(plan.pieces) == set(params)
    assert all(plan.shape(name) == tuple(params[name].shape) for name in params)
    assert LAYOUT.skeleton(config) == shapes
    assert comps.adapter().plan.latent_format == HUNYUAN_VIDEO


def test_comfyuis_latent_format_and_sampling():
    fmt = REF["latent_format"]
    assert (HUNYUAN_VIDEO.channels, HUNYUAN_VIDEO.scale, HUNYUAN_VIDEO.shift) == (
        fmt["channels"],
        fmt["scale_factor"],
        fmt["shift_factor"],
    )
    assert REF["t2v"]["model"]["comfy_model_class"] == "HunyuanVideo"
    assert REF["i2v"]["model"]["comfy_model_class"] == "HunyuanVideoI2V"


@pytest.mark.parametrize("kind", ["plain", "scaled", "comfy_quant"])
def test_fp8_files_stay_fp8_and_equal_their_dequantised_weights(tmp_path, kind):
    """ComfyUI's fp8 HunyuanVideo files (e4m3fn, "fp8 scaled", comfy_quant): block Linears stay fp8 on the device
    and compute (here in float32) as the model of the same dequantised weights."""
    from bigmodel_files import save, to_fp8  # tests/ helpers

    from parallel_runtime.attention.usp import SequenceParallelAttention

    state = tiny_hunyuan_video_state_dict(TinyHunyuanVideo(), "t2v")
    quantised = to_fp8(state, kind)
    scales = {k[: -len(".scale_weight")]: v for k, v in quantised.items() if k.endswith(".scale_weight")}
    scales.update({k[: -len(".weight_scale")]: v for k, v in quantised.items() if k.endswith(".weight_scale")})
    fp8 = {k[: -len(".weight")] for k, v in quantised.items() if v.dtype == torch.float8_e4m3fn}

    def dequantise(name: str, value: torch.Tensor) -> torch.Tensor:
        layer = name.rsplit(".", 1)[0]
        if value.dtype == torch.float8_e4m3fn:
            return value.float() * scales.get(layer, 1.0)
        if kind == "scaled" and layer in fp8:  # ComfyUI builds a scaled file's Linears in fp8: biases round too
            return value.to(torch.float8_e4m3fn).float()
        return value.float()

    dequantised = {k: dequantise(k, v) for k, v in quantised.items() if k in state}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 2, 4, 4, generator=g)
    cond = Conditioning(torch.randn(1, 5, 32, generator=g), torch.randn(1, 768, generator=g))
    mesh = ParallelMesh.single()
    outs = []
    for weights, name in ((quantised, "fp8"), (dequantised, "fp32")):
        comps = load_single_file_components(save(weights, tmp_path / f"{name}.safetensors"), "cpu", torch.float32)
        if name == "fp8":
            assert comps.transformer.transformer_blocks[0].attn.to_q.weight.dtype == torch.float8_e4m3fn
        with torch.no_grad():
            attention = SequenceParallelAttention(mesh, "sdpa")
            outs.append(comps.adapter().forward(x, 600.0, cond, mesh, attention, guidance=6.0).float())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
