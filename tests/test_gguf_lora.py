"""LoRA on GGUF models, patched the way ComfyUI-GGUF + ComfyUI's LoRA loaders patch them: quantised weights are
never rewritten, every patch is applied to the dequantised weight at each call (its blocks stay byte for byte),
F32 / F16 weights are patched once and stored back in their own dtype.

Oracles: the same LoRA stacks on the same weights dequantised by ComfyUI-GGUF, loaded from a .safetensors file
and patched by the safetensors path (whose results equal ComfyUI's own patched weights: test_lora_weights.py);
the tiny original-layout Flux and LoRA files of those tests (every format: kohya, PEFT, XLabs, LoKr, LoHa,
diff, DoRA, stacks). Swaps, strength changes and unpatching leave the blocks untouched and are exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import lora_files as lf
import pytest
import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf
from safetensors.torch import load_file

from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.gguf.model_file import transformer_shapes
from parallel_runtime.models.gguf.reader import GGUFFile
from parallel_runtime.models.lora.files import lora_file_id
from parallel_runtime.models.lora.keymap import TRANSFORMER
from parallel_runtime.models.lora.model_keys import model_keys
from parallel_runtime.models.lora.patcher import LoraPatcher, StackEntry
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer

DATA = Path(__file__).parent / "data"
REF = json.loads((DATA / "comfy_lora_reference.json").read_text())
CASES = [case for case in REF["cases"]["flux"] if case != "none"]


def lora(stem: str):
    return lora_file_id(DATA / "lora" / f"{stem}.safetensors")


def stack_of(case: str) -> list[StackEntry]:
    return [StackEntry(lora(stem), strength) for stem, strength in REF["cases"]["flux"][case]]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The tiny Flux of the LoRA reference as a Q8_0 GGUF (rows that are not whole blocks in F16), and the
    same tensors as ComfyUI-GGUF dequantises them, as .safetensors."""
    folder = tmp_path_factory.mktemp("gguf-lora")
    source = folder / "tiny_flux_original.safetensors"
    lf.write_model(REF["models"]["flux"]["skeleton"], str(source))
    path = write_gguf(folder / "flux-Q8_0.gguf", load_file(str(source)), "flux", "Q8_0", fallback="F16")
    return {"gguf": path, "reference": comfy_reference_file(path, folder / "reference.safetensors", torch.float32)}


def load(path: Path, original: dict | None = None):
    model, family, _ = load_single_file_transformer(path, "cpu", torch.float32)
    shapes = original if original is not None else transformer_shapes(GGUFFile(path))
    keys = model_keys(family, model, inspect_single_file(path).config, original=shapes)
    return model, LoraPatcher(keys, {TRANSFORMER: model})


def effective(model) -> dict[str, torch.Tensor]:
    """Every parameter as the model computes with it (a GGUF layer's dequantised, patched weight)."""
    layers = gguf_layers(model)
    out = {}
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        layer = layers.get(owner)
        out[name] = layer.compute_weight(torch.float32) if layer is not None and leaf == "weight" else p.detach()
    return {k: v.clone() for k, v in out.items()}


def stored(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def models(files):
    gguf_model, gguf_patcher = load(files["gguf"])
    ref_model, ref_patcher = load(files["reference"], transformer_shapes(GGUFFile(files["gguf"])))
    return gguf_model, gguf_patcher, ref_model, ref_patcher


@pytest.mark.parametrize("case", CASES)
def test_patched_gguf_weights_equal_the_patch_of_the_dequantised_weights(models, case):
    gguf_model, gguf_patcher, ref_model, ref_patcher = models
    kinds = {layer.kind.name for layer in gguf_layers(gguf_model).values()}
    assert {"Q8_0", "F16"} <= kinds
    gguf_patcher.apply(stack_of(case), [TRANSFORMER])
    ref_patcher.apply(stack_of(case), [TRANSFORMER])
    ours, expected = effective(gguf_model), effective(ref_model)
    f16 = {f"{name}.weight" for name, layer in gguf_layers(gguf_model).items() if layer.kind.name == "F16"}
    changed = 0
    for name, want in expected.items():
        got = ours[name]
        # F16 weights are stored back in F16 after patching (ComfyUI-GGUF's GGUFModelPatcher): one fp16 rounding
        tolerance = 2**-10 * want.abs().max().item() if name in f16 else 2e-6 * max(want.abs().max().item(), 1.0)
        assert (got - want).abs().max().item() <= tolerance, (case, name)
        changed += not torch.equal(want, ref_model.get_parameter(name).detach()) or name in f16
    assert changed


def test_blocks_never_change_and_swaps_are_exact(files):
    model, patcher = load(files["gguf"])
    blocks, pristine = stored(model), effective(model)
    patcher.apply([StackEntry(lora("flux_kohya"), 0.8), StackEntry(lora("flux_peft"), -0.6)], [TRANSFORMER])
    patched = effective(model)
    assert any(not torch.equal(patched[k], pristine[k]) for k in pristine)
    packed = {f"{n}.weight" for n, layer in gguf_layers(model).items() if layer.patched_per_call}
    assert packed and all(torch.equal(model.get_parameter(n), blocks[n]) for n in packed)  # blocks untouched
    patcher.apply([StackEntry(lora("flux_kohya"), 0.3), StackEntry(lora("flux_peft"), -0.6)], [TRANSFORMER])
    patcher.apply([StackEntry(lora("flux_dora"), 1.0), StackEntry(lora("flux_lokr"), 0.5)], [TRANSFORMER])
    patcher.apply([StackEntry(lora("flux_kohya"), 0.8), StackEntry(lora("flux_peft"), -0.6)], [TRANSFORMER])
    again = effective(model)
    assert all(torch.equal(again[k], patched[k]) for k in patched)
    patcher.apply([], [TRANSFORMER])
    assert all(torch.equal(v, pristine[k]) for k, v in effective(model).items())
    assert all(torch.equal(v, blocks[k]) for k, v in stored(model).items())
    assert not any(layer.patches or layer.patched is not None for layer in gguf_layers(model).values())


def test_a_lora_costs_its_factors_not_a_dequantised_copy(files):
    """Per-call patches keep the LoRA's factors on the layer, not a full-precision weight."""
    model, patcher = load(files["gguf"])
    patcher.apply([StackEntry(lora("flux_kohya"), 1.0)], [TRANSFORMER])
    layers = [layer for layer in gguf_layers(model).values() if layer.patches]
    assert layers and not any(layer.patched is not None for layer in layers)
    assert patcher.pristine_bytes < sum(layer.weight.numel() for layer in gguf_layers(model).values())
