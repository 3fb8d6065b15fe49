"""Qwen-Image-Edit's reference images give ComfyUI's picture on every sequence layout.

Oracle: tests/data/comfy_qwen_edit_reference.json, written by tests/data/make_comfy_qwen_edit_reference.py with
ComfyUI 0.3.64's own ReferenceLatent (what TextEncodeQwenImageEditPlus appends), FluxKontextMultiReferenceLatentMethod
and KSampler on the tiny Qwen-Image file (Qwen-Image-Edit / Edit-2509 have the same tensors). Two one-frame Wan
latents of odd sizes as references: the default ``index`` placement with CFG, ``offset`` on an odd grid, and
references on both branches. Run through the Parallel Sampler node on real CPU worker pools: one rank, Ulysses 2,
Ring 2 (reference tokens split with the image's) and CFG 2.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.models.families.qwen_image.comfy_inputs import reference_images

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_qwen_edit_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4  # relative L2 (issue 25)
LAYOUTS = {
    "1rank": dict(devices="cpu:1"),
    "ulysses2": dict(devices="cpu:2", ulysses=2),
    "ring2": dict(devices="cpu:2", ring=2),
    "cfg2": dict(devices="cpu:2", cfg_parallel=2),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def conditioning(entry: dict, with_references: bool = True) -> list:
    options: dict = {}
    if with_references and "reference_latents" in entry:
        options["reference_latents"] = [tensor(n) for n in entry["reference_latents"]]
        if "reference_latents_method" in entry:
            options["reference_latents_method"] = entry["reference_latents_method"]
    return [[tensor(entry["embeds"]), options]]


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def load(ctx: NodeContext, layout: str):
    spec = {"ulysses": 1, "ring": 1, "cfg_parallel": 1, **LAYOUTS[layout]}
    (handle,) = ParallelModelLoader(ctx).load(
        model=str(DATA / REFERENCE["file"]),
        family="auto",
        layout="manual",
        pipefusion=1,
        pp_patches=0,
        pp_warmup=0,
        dtype="fp32",
        attention="auto",
        **spec,
    )["result"]
    return handle


def sample(ctx: NodeContext, handle, case: dict, with_references: bool = True) -> torch.Tensor:
    (out,) = ParallelSampler(ctx).sample(
        handle,
        conditioning(case["positive"], with_references),
        conditioning(case["negative"], with_references),
        {"samples": torch.zeros(case["latent_shape"])},
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler_name"],
        case["scheduler"],
        case["denoise"],
    )["result"]
    return out["samples"]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got = got.reshape(expected.shape) if got.numel() == expected.numel() else got  # [B,16,H,W] vs [B,16,1,H,W]
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm())


def _params():
    return [
        pytest.param(layout, case, id=f"{layout}-{case['name']}")
        for layout in LAYOUTS
        for case in REFERENCE["cases"]
        if not (layout == "cfg2" and math.isclose(case["cfg"], 1.0))
    ]


@pytest.mark.parametrize(("layout", "case"), _params())
def test_qwen_edit_equals_comfy_ksampler(node_ctx, layout, case):
    got = sample(node_ctx, load(node_ctx, layout), case)
    error = relative_error(got, tensor(case["samples"]))
    assert error <= TOLERANCE, f"{case['name']} on {layout}: relative error {error:.2e}"


def test_references_change_the_picture(node_ctx):
    """The oracle is not blind to the references: without them the result is far from ComfyUI's."""
    case = REFERENCE["cases"][0]
    got = sample(node_ctx, load(node_ctx, "1rank"), case, with_references=False)
    assert relative_error(got, tensor(case["samples"])) > 100 * TOLERANCE


def test_qwen_reference_ids_are_centred_and_indexed():
    """Qwen-Image's ids, worked by hand: reference k has frame index k (``index``, the default) and rows and
    columns centred like the image's own (a 3x4-token reference: rows -1..1, columns -2..1)."""
    refs = reference_images(
        {"reference_latents": [torch.ones(1, 16, 1, 5, 7), torch.ones(1, 16, 1, 6, 6)]}, {}, "positive"
    )
    ids = refs.ids[0]
    assert refs.tokens.shape == (1, 12 + 9, 64)
    assert ids[:12, 0].eq(1).all() and ids[12:, 0].eq(2).all()
    assert ids[:12, 1].unique().tolist() == [-1, 0, 1] and ids[:4, 2].tolist() == [-2, -1, 0, 1]
    assert ids[12:, 1].unique().tolist() == [-1, 0, 1]
