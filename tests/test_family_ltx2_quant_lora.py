"""LTX-2 release files stored other ways, and LoRAs: a GGUF of the transformer (ComfyUI-GGUF's "ltxv" layout: its
convert.py takes LTX-2's Lightricks names as LTX-Video's, written here with the ``gguf`` package), a ComfyUI "fp8
scaled" file, and LoRA files in Lightricks' (``diffusion_model.``) and diffusers' (``transformer.``) names.

Oracles: the GGUF's tensors dequantised by ComfyUI-GGUF's own code, saved as a .safetensors file and read through the
safetensors path (exactly equal); the fp8 file's weights dequantised (fp8 x scale, the fp8 layers' biases rounded as
ComfyUI rounds them) in a float32 file; the LoRA's merged weights by the formula W + strength x alpha / rank x B A
(video modules; its audio module is never loaded, so never patched). Each on one device (in process) and on
Ulysses 2 (worker processes, one pool) equal to one device. The transformer is 128 wide (32 heads of 4: the heads a
file without config metadata is read with), so that Q8_0 blocks fill its rows."""

from __future__ import annotations

import math

import pytest
import torch
from bigmodel_files import to_fp8
from comfy_gguf import comfy_reference_file
from family_layout_cases import LAYOUTS, close
from gguf_files import write_gguf
from safetensors.torch import save_file
from test_family_ltx2_files import PREFIX, original_name
from test_family_ltx2_files import _audio as audio_side

from dit_devtools.tiny.ltx2 import ltx2_transformer
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.ltx2.conditioning import LTX2FrameRate
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.lora.files import lora_file_id
from parallel_runtime.models.lora.keymap import TRANSFORMER
from parallel_runtime.models.lora.model_keys import model_keys
from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry
from parallel_runtime.models.registry import get_adapter
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

WIDE = dict(num_attention_heads=32, attention_head_dim=4, cross_attention_dim=128, audio_num_attention_heads=32,
            audio_attention_head_dim=2, audio_cross_attention_dim=64)  # fmt: skip
RANK, ALPHA, STRENGTH = 4, 2.0, 0.8
TARGETS = (
    "transformer_blocks.0.attn1.to_q",
    "transformer_blocks.1.attn2.to_k",
    "transformer_blocks.0.ff.net.0.proj",
    "proj_in",
    "transformer_blocks.0.audio_attn1.to_v",
)  # diffusers' names; the last is the audio stream's


def _lora(names: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """lora_A / lora_B (+ alpha) for each target, under the file's names ``names[target]``."""
    g = torch.Generator().manual_seed(5)
    out = {}
    for target in TARGETS:
        rows, cols = shapes[target + ".weight"]
        out[f"{names[target]}.lora_A.weight"] = torch.randn(RANK, cols, generator=g) / math.sqrt(cols)
        out[f"{names[target]}.lora_B.weight"] = torch.randn(rows, RANK, generator=g) * 0.5
        out[f"{names[target]}.alpha"] = torch.tensor(ALPHA)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ltx2-quant")
    model = ltx2_transformer(seed=3, **WIDE)
    diffusers_state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state = {original_name(k): v for k, v in diffusers_state.items()}
    out = {"fp32": root / "ltx2.safetensors", "fp8": root / "ltx2_fp8_scaled.safetensors"}
    save_file({PREFIX + k: v for k, v in state.items()}, str(out["fp32"]))
    fp8 = to_fp8({k: v.float() for k, v in state.items()}, "scaled")
    save_file({PREFIX + k: v.contiguous() for k, v in fp8.items()}, str(out["fp8"]))
    dequantised = {}
    for name in state:
        layer = name.removesuffix(".weight").removesuffix(".bias")
        if f"{layer}.scale_weight" not in fp8:
            dequantised[name] = fp8[name].float()  # plain parameters: bf16 in the fp8 file
        elif name.endswith(".weight"):
            dequantised[name] = fp8[name].float() * fp8[f"{layer}.scale_weight"]
        else:  # an fp8 layer's bias: rounded to fp8 as ComfyUI's fp8 parameters round it
            dequantised[name] = fp8[name].to(torch.float8_e4m3fn).float()
    out["fp8_ref"] = root / "ltx2_fp8_dequantised.safetensors"
    save_file({PREFIX + k: v.contiguous() for k, v in dequantised.items()}, str(out["fp8_ref"]))
    out["gguf"] = write_gguf(root / "ltx2-Q8_0.gguf", state, "ltxv", "Q8_0", prefix=PREFIX)
    out["gguf_ref"] = comfy_reference_file(out["gguf"], root / "ltx2_gguf_dequantised.safetensors", torch.float32)
    shapes = {k: tuple(v.shape) for k, v in diffusers_state.items()}
    original = {t: "diffusion_model." + original_name(t + ".weight").removesuffix(".weight") for t in TARGETS}
    for kind, names in (("lora_original", original), ("lora_diffusers", {t: "transformer." + t for t in TARGETS})):
        out[kind] = root / f"ltx2_{kind}.safetensors"
        save_file(_lora(names, shapes), str(out[kind]))
    out["merged"] = _merged(diffusers_state, _lora({t: t for t in TARGETS}, shapes))
    return out


def _merged(state: dict[str, torch.Tensor], lora: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The video weights with the LoRA merged by its formula (audio ones are never loaded)."""
    merged = dict(state)
    for t in TARGETS:
        delta = lora[f"{t}.lora_B.weight"] @ lora[f"{t}.lora_A.weight"] * (ALPHA / RANK) * STRENGTH
        merged[t + ".weight"] = state[t + ".weight"] + delta
    return {k: v for k, v in merged.items() if not audio_side(k)}


def _inputs():
    g = torch.Generator().manual_seed(1)
    conds = []
    for kept in (7, 4):
        mask = torch.zeros(1, 7)
        mask[:, :kept] = 1
        conds.append(Conditioning(torch.randn(1, 7, 32, generator=g), None, mask, LTX2FrameRate(torch.tensor([24.0]))))
    return conds[0], conds[1], torch.zeros(1, 128, 2, 3, 4), SamplingSettings(seed=4, steps=2, cfg=3.0, sampler="euler")


def _sample(transformer) -> torch.Tensor:
    adapter = get_adapter(transformer)
    pos, neg, latent, settings = _inputs()
    return denoise_latent(adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, latent, settings)


def _forward(transformer) -> torch.Tensor:
    pos, *_ = _inputs()
    x = torch.randn(1, 128, 2, 3, 4, generator=torch.Generator().manual_seed(2))
    mesh = ParallelMesh.single()
    with torch.no_grad():
        return get_adapter(transformer).forward(x, torch.tensor([0.7]), pos, mesh, SequenceParallelAttention(mesh))


def _load(path):
    return load_single_file_transformer(path, "cpu", torch.float32)[0]


def _patched(files, kind):
    model = _load(files["fp32"])
    keys = model_keys("ltx2", model, inspect_single_file(files["fp32"]).config)
    LoraPatcher(keys, {TRANSFORMER: model}).apply([StackEntry(lora_file_id(files[kind]), STRENGTH, 0.0)], [TRANSFORMER])
    return model


@torch.no_grad()
def test_gguf_equals_comfyui_gguf_s_dequantised_weights(files):
    ours = _load(files["gguf"])
    layers = gguf_layers(ours)
    assert layers["transformer_blocks.0.attn1.to_q"].kind.name == "Q8_0"
    assert not any(audio_side(n) for n in layers)  # the audio stream is never read: no GGUF layer of it is placed
    torch.testing.assert_close(_forward(ours), _forward(_load(files["gguf_ref"])), rtol=0, atol=0)


@torch.no_grad()
def test_fp8_scaled_file_keeps_fp8_and_equals_its_dequantised_weights(files):
    ours = _load(files["fp8"])
    assert ours.transformer_blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn
    torch.testing.assert_close(_forward(ours), _forward(_load(files["fp8_ref"])), rtol=1e-5, atol=1e-6)


@torch.no_grad()
@pytest.mark.parametrize("kind", ["lora_original", "lora_diffusers"])
def test_lora_patches_the_merged_weights(files, kind):
    model = _patched(files, kind)
    params = dict(model.named_parameters())
    merged = files["merged"]
    for name, value in merged.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=1e-6, msg=name)
    assert params["transformer_blocks.0.audio_attn1.to_v.weight"].device.type == "meta"
    plain = _load(files["fp32"])
    assert not torch.allclose(_forward(model), _forward(plain), atol=1e-3)  # the LoRA changes the prediction


def test_ulysses2_equals_one_device_for_gguf_fp8_and_lora(cpu_pool, files):
    """One pool, three loads: each file (the LoRA on the fp32 file, as the Parallel LoRA Loader sends it) sampled on
    Ulysses 2 equals the same model sampled on one device."""
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pos, neg, latent, settings = _inputs()
    with torch.no_grad():
        expected = {"gguf": _sample(_load(files["gguf"])), "fp8": _sample(_load(files["fp8"])),
                    "lora": _sample(_patched(files, "lora_original"))}  # fmt: skip
    for kind, path in (("gguf", files["gguf"]), ("fp8", files["fp8"]), ("lora", files["fp32"])):
        pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
        loras = (StackEntry(lora_file_id(files["lora_original"]), STRENGTH, 0.0),) if kind == "lora" else ()
        got = pool.submit(generate, pos, neg, latent, settings, loras=loras).result(300)
        assert close(got, expected[kind]), kind
