"""A HiDream-I1 file in ComfyUI's "fp8 scaled" layout (``scaled_fp8`` marker, float8_e4m3fn Linear weights with
their ``.scale_weight``; the MoE gates, plain parameters, in bf16) stays fp8 and samples as ComfyUI's UNETLoader
+ KSampler on the same file: the Parallel Sampler (node and API) on one rank and Ulysses 2 within 1e-4.

Oracle: tests/data/comfy_hidream_fp8_reference.json and comfy_ref_hidream_fp8_scaled.safetensors, written by
tests/data/make_comfy_hidream_fp8_reference.py with ComfyUI 0.3.64's own loader and KSampler (compute float32).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from comfy_ksampler_cases import LAYOUTS, TOLERANCE, layout_params, node_context, sample_both_ways, tensor_reader
from test_family_hidream_comfy import api_branch, comfy_conditioning

from parallel_runtime.models.single_file import load_single_file_components

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_hidream_fp8_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["file"]
FP8_LAYOUTS = {k: LAYOUTS[k] for k in ("1rank", "ulysses2")}
STEPS = max(case["steps"] for case in REFERENCE["cases"])
tensor = tensor_reader(REFERENCE)


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return node_context(pool_registry)


def test_fp8_scaled_hidream_keeps_its_linears_fp8_as_comfyui_does():
    loaded = REFERENCE["loaded"]
    assert loaded["attn1.to_q.weight"] == "torch.float8_e4m3fn" and loaded["ff_i.gate.weight"] == "torch.float32"
    comps = load_single_file_components(FILE, "cpu", torch.float32)
    block = comps.transformer.double_stream_blocks[0].block
    assert block.attn1.to_q.weight.dtype == torch.float8_e4m3fn
    assert block.ff_i.experts[0].w1.weight.dtype == torch.float8_e4m3fn
    assert block.ff_i.gate.weight.dtype == torch.float32


@pytest.mark.parametrize(
    ("layout", "case"),
    layout_params(REFERENCE["cases"], FP8_LAYOUTS, lambda layout, name: name == "hidream_default_euler"),
)
def test_parallel_sampler_equals_comfyui_on_fp8_scaled_hidream(node_ctx, pool_registry, layout, case):
    node = case.get("model_sampling")
    errors = sample_both_ways(
        node_ctx,
        pool_registry,
        str(FILE),
        FP8_LAYOUTS[layout],
        case,
        STEPS,
        tensor,
        comfy_conditioning,
        api_branch,
        None if node is None else node["inputs"],
    )
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} ({case['what']}) on {layout}: {errors}"
