"""LoRA on an fp8 file's layers (models/fp8.Fp8Linear, loaded from a ComfyUI "fp8 scaled" single file):
the patch is computed in fp32 from the layer's dequantised weight, exactly as for the same weights held
in fp32, and stored back as fp8 under the layer's own scale with the per-tensor seeded stochastic
rounding; strength changes are bit-exact and unpatching returns the loaded fp8 bytes (the layer keeps
its original; LoRA keeps no copy of it). The file's scales and marker are not taken for model tensors,
so original-layout (kohya) names still route onto the fused layers."""

from __future__ import annotations

import json
from pathlib import Path

import bigmodel_files as bf
import lora_files as lf
import pytest
import torch
from safetensors.torch import load_file

from parallel_runtime.models.fp8 import FP8_MAX, Fp8Linear, fp8_layers
from parallel_runtime.models.lora.files import lora_file_id
from parallel_runtime.models.lora.keymap import TRANSFORMER
from parallel_runtime.models.lora.model_keys import model_keys
from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry
from parallel_runtime.models.lora.rounding import rounding_for
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.service.lora_state import file_layout

DATA = Path(__file__).parent / "data"
REF = json.loads((DATA / "comfy_lora_reference.json").read_text())
FP8 = torch.float8_e4m3fn


def lora(stem: str):
    return lora_file_id(DATA / "lora" / f"{stem}.safetensors")


@pytest.fixture(scope="module")
def fp8_file(tmp_path_factory) -> Path:
    """The tiny original-layout Flux of the LoRA oracle, saved as ComfyUI "fp8 scaled"."""
    folder = tmp_path_factory.mktemp("lora-fp8")
    plain = lf.write_model(REF["models"]["flux"]["skeleton"], str(folder / "tiny_flux.safetensors"))
    return bf.save(bf.to_fp8(load_file(plain), "scaled"), folder / "tiny_flux_fp8_scaled.safetensors")


def load(path: Path, storage: str):
    model, family, _ = load_single_file_transformer(path, "cpu", torch.float32, storage=storage)
    keys = model_keys(family, model, inspect_single_file(path).config, original=file_layout(path))
    return model, LoraPatcher(keys, {TRANSFORMER: model})


def fp8_bytes(layers: dict[str, Fp8Linear]) -> dict[str, torch.Tensor]:
    return {name: layer.weight.detach().view(torch.uint8).clone() for name, layer in layers.items()}


def test_lora_on_fp8_layers_equals_the_fp32_patch_rounded_under_the_layers_scale(fp8_file):
    model, patcher = load(fp8_file, "auto")  # fp8 layers kept in fp8
    reference, reference_patcher = load(fp8_file, "compute")  # the same values, in fp32
    layers = fp8_layers(model)
    assert len(layers) > 10 and "scaled_fp8" not in file_layout(fp8_file)
    for name, layer in layers.items():
        assert torch.equal(reference.get_submodule(name).weight, layer.dequantised()), name
    loaded = fp8_bytes(layers)
    stack = [StackEntry(lora("flux_kohya"), 0.8), StackEntry(lora("flux_peft"), -0.6)]
    patcher.apply(stack, [TRANSFORMER])
    reference_patcher.apply(stack, [TRANSFORMER])

    touched = [name for name, layer in layers.items() if layer.original is not None]
    assert len(touched) >= 5  # kohya's fused qkv / linear1 names and PEFT's names reach fp8 layers
    assert "transformer_blocks.0.attn.to_q" in touched and "single_transformer_blocks.0.proj_mlp" in touched
    fp32_copies = sum(layers[name].weight.numel() * 4 for name in touched)
    assert patcher.pristine_bytes == reference_patcher.pristine_bytes - fp32_copies  # no LoRA copy of fp8 weights
    for name, layer in layers.items():
        assert layer.weight.dtype == FP8 and layer.patched is None
        patched = reference.get_submodule(name).weight.detach()
        if name not in touched:  # a layer no LoRA touches keeps its loaded bytes
            assert torch.equal(patched, layer.dequantised()), name
            assert torch.equal(layer.weight.view(torch.uint8), loaded[name]), name
            continue
        x = (patched / layer.weight_scale).clamp(-FP8_MAX[FP8], FP8_MAX[FP8])
        expected = rounding_for(f"{TRANSFORMER}.{name}.weight")(x, FP8)
        assert torch.equal(layer.weight.view(torch.uint8), expected.view(torch.uint8)), name
    fp8_params = {f"{name}.weight" for name in layers}
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        if name not in fp8_params:
            assert torch.equal(p, q), name  # the wider parameters patched as usual

    after = fp8_bytes(layers)
    patcher.apply([StackEntry(lora("flux_kohya"), 0.3), StackEntry(lora("flux_peft"), -0.6)], [TRANSFORMER])
    patcher.apply([StackEntry(lora("flux_lokr"), 1.0)], [TRANSFORMER])
    patcher.apply(stack, [TRANSFORMER])
    for name, value in fp8_bytes(layers).items():
        assert torch.equal(value, after[name]), name  # recomputed from the original: the same bits
    patcher.apply([], [TRANSFORMER])
    for name, value in fp8_bytes(layers).items():
        assert torch.equal(value, loaded[name]), name  # the loaded fp8 weight, bit for bit
        assert layers[name].original is None
