"""Same picture as ComfyUI's KSampler on SD3.5 Large and Medium files: the Parallel Sampler, through its node and
through the API, against ComfyUI 0.3.64's own KSampler (UNETLoader's MMDiT with RMS q/k norms; Medium's MMDiT-X
dual-attention blocks; ModelSamplingSD3) on the same single files in Stability's layout (``model.diffusion_model.``
names), on one rank, Ulysses 2, CFG 2 and PipeFusion 2 (warmup = steps: exact); the files are told apart as ComfyUI
detects them.

Oracle: tests/data/comfy_sd35_reference.json and comfy_ref_sd35_{large,medium}.safetensors, written by
tests/data/make_comfy_sd35_reference.py from the ComfyUI snapshot.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comfy_ksampler_cases import (  # tests/ helper
    LAYOUTS,
    TOLERANCE,
    layout_params,
    node_context,
    sample_both_ways,
    tensor_reader,
)

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.single_file import inspect_single_file

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_sd35_reference.json").read_text(encoding="utf-8"))
VARIANTS = {"sd35_large": "sd3.5-large", "sd35_medium": "sd3.5-medium"}
# Every case runs on one rank against ComfyUI. Samplers, schedules and ModelSamplingSD3 act on the whole latent on
# the host, the same on every layout, so a parallel layout runs the cases whose model pass it splits differently:
# the default one per variant, and on Ulysses the odd size (padded tokens). PipeFusion takes whole 16 px tokens.
PARALLEL_CASES = {
    "ulysses2": ("_default_euler", "_odd_size"),
    "cfg2": ("_default_euler",),
    "pipefusion2": ("_default_euler",),
}
tensor = tensor_reader(REFERENCE)


def file_of(model: str) -> Path:
    return DATA / REFERENCE["models"][model]["file"]


def comfy_conditioning(entries: list[dict]) -> list:
    """The CONDITIONING TripleCLIPLoader + CLIPTextEncode give: token states and the pooled CLIP vectors."""
    return [[tensor(e["embeds"]), {"pooled_output": tensor(e["pooled"])}] for e in entries]


def api_branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(CondEntry(Conditioning(tensor(e["embeds"]), tensor(e["pooled"]))) for e in entries)


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return node_context(pool_registry)


@pytest.mark.parametrize(
    ("layout", "case"),
    layout_params(REFERENCE["cases"], LAYOUTS, lambda layout, name: name.endswith(PARALLEL_CASES[layout])),
)
def test_parallel_sampler_equals_comfy_ksampler(node_ctx, pool_registry, layout, case):
    node = case["model_sampling"]
    if node is not None:
        assert node["node"] == "ModelSamplingSD3"
    path, steps = str(file_of(case["model"])), case["steps"]
    errors = sample_both_ways(
        node_ctx,
        pool_registry,
        path,
        LAYOUTS[layout],
        case,
        steps,
        tensor,
        comfy_conditioning,
        api_branch,
        None if node is None else node["inputs"],
    )
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} ({case['what']}) on {layout}: {errors}"


@pytest.mark.parametrize("model", sorted(VARIANTS))
def test_the_files_are_told_apart_as_comfyui_detects_them(model):
    """The variant and structure read from Stability's names are ComfyUI's detection: RMS q/k norms in both,
    Medium's dual-attention layers; shift 3.0 and SD3's latent format, as ComfyUI derives them."""
    info, comfy = inspect_single_file(file_of(model)), REFERENCE["models"][model]
    structure = comfy["structure"]
    assert info.variant == VARIANTS[model] and info.prefix == comfy["prefix"]
    assert info.config["qk_norm"] == "rms_norm" and structure["qk_norm"] == "rms"
    assert list(info.config["dual_attention_layers"]) == structure["x_block_self_attn_layers"]
    assert info.config["num_layers"] == structure["depth"]
    assert info.config["num_attention_heads"] * info.config["attention_head_dim"] == structure["hidden"]
    assert info.config["pos_embed_max_size"] == structure["pos_embed_max_size"]
    from parallel_runtime.models.families.registry import family

    class Config(dict):
        __getattr__ = dict.get

    plan = family("sd3").adapter().make_plan(Config(info.config), None)
    derived = comfy["comfy"]
    assert (derived["model_type"], derived["model_sampling"]) == ("FLOW", "ModelSamplingDiscreteFlow")
    spec = plan.model_sampling
    assert spec.kind == "discrete_flow" and spec.shift == pytest.approx(derived["shift"])
    assert spec.multiplier == pytest.approx(derived["multiplier"])
    fmt = plan.latent_format
    assert (fmt.scale, fmt.shift) == pytest.approx(
        (derived["latent_format"]["scale"], derived["latent_format"]["shift"])
    )
