"""A ComfyUI "fp8 scaled" file whose Linear weights outside the blocks are stored in bf16 (scale 1, or no
scale) loads as ComfyUI loads it — every Linear of such a model rounded to fp8 — and samples as ComfyUI's
KSampler does.

Oracle: tests/data/comfy_fp8_mixed_reference.json and comfy_ref_flux_dev_fp8_mixed.safetensors, written by
tests/data/make_comfy_fp8_mixed_reference.py with ComfyUI 0.3.64's own loader and KSampler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models import Conditioning, get_adapter
from parallel_runtime.models.fp8 import detect_quantisation, fp8_layers
from parallel_runtime.models.single_file import load_single_file_transformer
from parallel_runtime.parallel.mesh import ParallelMesh

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "comfy_fp8_mixed_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["file"]


def _tensor(name: str) -> torch.Tensor:
    entry = REFERENCE["tensors"][name]
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def _cond(name: str) -> Conditioning:
    return Conditioning(_tensor(f"{name}.embeds"), _tensor(f"{name}.pooled"))


@pytest.fixture(scope="module")
def model():
    model, family, _ = load_single_file_transformer(FILE, "cpu", torch.float32)
    assert family == "flux"
    return model


def test_every_linear_is_held_in_fp8_as_comfyui_holds_it(model):
    from safetensors.torch import load_file

    stored = load_file(FILE)
    layers = fp8_layers(model)
    # bf16 weights outside the blocks, with scale 1 or none, are rounded to fp8 (ComfyUI's loaded dtype)
    assert REFERENCE["comfy_loaded"]["img_in.weight"] == "torch.float8_e4m3fn"
    for name, original in (
        ("x_embedder", "img_in"),
        ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
    ):
        layer = layers[name]
        assert layer.weight.dtype == torch.float8_e4m3fn and not layer.scaled
        assert torch.equal(layer.weight, stored[f"{original}.weight"].to(torch.float8_e4m3fn))
        # and so are the biases of every fp8 Linear (ComfyUI makes the whole layer fp8)
        assert torch.equal(layer.bias, stored[f"{original}.bias"].to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("case", [c["name"] for c in REFERENCE["cases"]])
@torch.no_grad()
def test_a_mixed_fp8_scaled_file_samples_as_comfyui(model, case):
    entry = next(c for c in REFERENCE["cases"] if c["name"] == case)
    adapter = get_adapter(model)
    settings = SamplingSettings(
        seed=entry["seed"],
        steps=entry["steps"],
        cfg=entry["cfg"],
        sampler=entry["sampler_name"],
        scheduler=entry["scheduler"],
        denoise=entry["denoise"],
    )
    latent = torch.zeros(1, 16, entry["height"] // 8, entry["width"] // 8)
    got = denoise_latent(
        adapter,
        ParallelMesh.single(),
        model_sampling_for(adapter),
        _cond(entry["positive"]),
        _cond(entry["negative"]),
        latent,
        settings,
    )
    expected = _tensor(entry["samples"])
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


def test_a_wide_scaled_weight_is_accepted_only_in_a_marked_file():
    """A scale on a bf16 weight is ComfyUI's "round it to fp8" only where the scaled_fp8 marker makes
    every Linear fp8; elsewhere (no marker) ComfyUI would ignore the scale: refused as ambiguous."""
    header = {
        "scaled_fp8": {"dtype": "F8_E4M3", "shape": [0]},
        "a.weight": {"dtype": "BF16", "shape": [4, 4]},
        "a.scale_weight": {"dtype": "F32", "shape": []},
        "b.weight": {"dtype": "F8_E4M3", "shape": [4, 4]},
        "b.scale_weight": {"dtype": "F32", "shape": []},
    }
    quant = detect_quantisation(header)
    assert quant.kind == "fp8_scaled" and quant.fp8_weights["a.weight"] == torch.float8_e4m3fn
    assert quant.rounded == {"a.weight"} and quant.scales["a.weight"] == "a.scale_weight"
    unmarked = {k: v for k, v in header.items() if k != "scaled_fp8"}
    with pytest.raises(ConfigError, match="a.scale_weight scales a.weight, which is stored in bf16"):
        detect_quantisation(unmarked)
