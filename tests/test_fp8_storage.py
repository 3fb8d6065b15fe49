"""fp8 storage: the three file conventions, Fp8Linear against the same upcast weights, the LoRA hooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.fp8 import (
    Fp8Linear,
    dequantise_model,
    detect_quantisation,
    fp8_layers,
    quantise_per_tensor,
    set_scale,
    swap_to_fp8,
)
from parallel_runtime.models.tensor_files import SafetensorsFile

DATA = Path(__file__).parent / "data"


def _info(path: Path):
    with SafetensorsFile(path) as f:
        return detect_quantisation(f.header, f.read)


def test_detects_plain_and_comfyui_scaled_fp8_files():
    bf16 = _info(DATA / "tiny_qwen_image_bf16.safetensors")
    plain = _info(DATA / "tiny_qwen_image_fp8_e4m3fn.safetensors")
    scaled = _info(DATA / "tiny_qwen_image_fp8_e4m3fn_scaled.safetensors")
    assert bf16.kind == "none" and not bf16.fp8_weights
    assert plain.kind == "fp8" and not plain.scales
    assert "transformer_blocks.0.attn.to_q.weight" in plain.fp8_weights
    assert scaled.kind == "fp8_scaled" and "scaled_fp8" in scaled.extra_keys
    assert scaled.scales["transformer_blocks.0.attn.to_q.weight"] == "transformer_blocks.0.attn.to_q.scale_weight"
    assert set(scaled.scales) == set(scaled.fp8_weights)  # every Linear weight of that file is scaled


def _comfy_quant(fmt: str) -> torch.Tensor:
    return torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)


def test_comfy_kitchen_layers_are_read_and_other_formats_refused(tmp_path):
    w, s = quantise_per_tensor(torch.randn(8, 4))
    good = {
        "a.weight": w,
        "a.weight_scale": s.reshape(()),
        "a.comfy_quant": _comfy_quant("float8_e4m3fn"),
        "a.bias": torch.zeros(8),
    }
    save_file(good, tmp_path / "good.safetensors")
    info = _info(tmp_path / "good.safetensors")
    assert info.kind == "comfy_quant" and info.scales == {"a.weight": "a.weight_scale"}
    assert "a.comfy_quant" in info.extra_keys and "a.weight_scale" in info.extra_keys
    save_file({**good, "a.comfy_quant": _comfy_quant("nvfp4")}, tmp_path / "nvfp4.safetensors")
    with pytest.raises(ConfigError, match="nvfp4"):
        _info(tmp_path / "nvfp4.safetensors")
    save_file({"a.weight": w, "a.weight_scale": torch.ones(8)}, tmp_path / "rows.safetensors")
    with pytest.raises(ConfigError, match="per-tensor"):
        _info(tmp_path / "rows.safetensors")


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8, bias=False)).eval()


def _fp8_copy(model: nn.Sequential) -> nn.Sequential:
    """The same model with fp8 storage (per-tensor scale), built the way the loader does: swap on meta, assign."""
    with torch.device("meta"):
        fp8 = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8, bias=False))
    assert swap_to_fp8(fp8, ["0.weight", "2.weight"]) == ["0", "2"]
    for name, layer in fp8_layers(fp8).items():
        src = model.get_submodule(name)
        values, scale = quantise_per_tensor(src.weight.detach())
        layer.weight = nn.Parameter(values, requires_grad=False)
        set_scale(layer, scale, torch.device("cpu"))
        if src.bias is not None:
            layer.bias = nn.Parameter(src.bias.detach().clone(), requires_grad=False)
    return fp8.eval()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_layers_equal_the_upcast_weights(dtype):
    fp8 = _fp8_copy(_model())
    layer = fp8[0]
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.scaled
    reference = dequantise_model(_fp8_copy(_model()), dtype)  # plain nn.Linear holding fp8 x scale in dtype
    assert not fp8_layers(reference) and reference[0].weight.dtype == dtype
    x = torch.randn(3, 16, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(fp8(x), reference(x))


def test_patch_requantise_and_restore_return_the_loaded_weight_bit_for_bit():
    layer = _fp8_copy(_model())[0]
    loaded = layer.weight.detach().clone()
    x = torch.randn(2, 16)
    before = layer(x)
    delta = 0.01 * torch.randn(32, 16)
    layer.set_patched(layer.dequantised() + delta)
    patched = layer(x)
    assert torch.allclose(patched - before, x @ delta.T, atol=1e-5)
    layer.restore()
    assert torch.equal(layer(x), before)
    layer.requantise_(layer.dequantised() + delta)
    assert not torch.equal(layer.weight, loaded)
    scale = layer.weight_scale
    expected = ((layer.original.float() * scale + delta) / scale).to(torch.float8_e4m3fn)
    assert torch.equal(layer.weight.view(torch.uint8), expected.view(torch.uint8))
    layer.restore()
    assert torch.equal(layer.weight.view(torch.uint8), loaded.view(torch.uint8))
    assert isinstance(layer, Fp8Linear) and isinstance(layer, nn.Linear)
