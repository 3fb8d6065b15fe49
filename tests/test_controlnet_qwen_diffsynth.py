"""DiffSynth Qwen-Image ControlNet model patches on the worker pool, against ComfyUI 0.3.64's own graph. Oracle:
tests/data/comfy_qwen_diffsynth_reference.json, written by tests/data/make_comfy_qwen_diffsynth_reference.py
(ModelPatchLoader -> QwenImageDiffsynthControlnet with the hint VAE -> KSampler, on the tiny Qwen-Image file and
tests/controlnet_files.py's tiny patch). Here the same file and image go through ``service.controlnets.patched_model``
(what Parallel Qwen-Image DiffSynth ControlNet calls) on real CPU pools: one rank, Ulysses 2, CFG 2; chained
patches apply in order; the patch's tokens stay split under Ulysses (nothing gathered, no extra all-to-all).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from controlnet_files import (  # tests/ helper
    QWEN_DIFFSYNTH,
    QWEN_DIFFSYNTH_INPAINT,
    qwen_diffsynth_inpaint_state,
    qwen_diffsynth_state,
)

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.controlnet_files import describe_controlnet
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.controlnets import ModelPatch, patched_model

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from controlnet_hint_vae import HintVAE  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_qwen_diffsynth_reference.json").read_text(encoding="utf-8"))
INPAINT = json.loads((DATA / "comfy_qwen_diffsynth_inpaint_reference.json").read_text(encoding="utf-8"))
MODEL = DATA / REFERENCE["model_file"]
TOLERANCE = 1e-4  # relative L2
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
}


@functools.cache
def tensor(name: str, reference: str = "patch") -> torch.Tensor:
    t = (REFERENCE if reference == "patch" else INPAINT)["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


@functools.cache
def model_on(layout: str, registry):
    devices, config = LAYOUTS[layout]
    return load_parallel_model(LoadRequest(model=str(MODEL), devices=devices, layout=config), registry)


def patched(model, applies):
    info = describe_controlnet(QWEN_DIFFSYNTH)
    for a in applies:
        model = patched_model(
            model, ModelPatch(info, tensor(f"hint.{a['hint']}"), HintVAE(frame_axis=True), a["strength"])
        )
    return model


def run(model, case, reference: str = "patch") -> torch.Tensor:
    entry = lambda name: (CondEntry(Conditioning(tensor(f"text.{name}", reference))),)  # noqa: E731
    shape = case["latent_shape"]
    return model.sample(
        entry(case["positive"]),
        entry(case["negative"]),
        torch.zeros(shape),
        shape[-1] * 8,
        shape[-2] * 8,
        seed=case["seed"],
        steps=case["steps"],
        cfg=case["cfg"],
        sampler_name=case["sampler_name"],
        scheduler=case["scheduler"],
    )


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    got = got.reshape(expected.shape) if got.numel() == expected.numel() else got  # [B,16,H,W] vs [B,16,1,H,W]
    assert got.shape == expected.shape
    return float((got.float() - expected).norm() / expected.norm())


def _params(reference=REFERENCE):
    return [
        pytest.param(layout, case, id=f"{layout}-{case['name']}")
        for layout in LAYOUTS
        for case in reference["cases"]
        if not (layout == "cfg2" and math.isclose(case["cfg"], 1.0))
    ]


def test_stored_patch_is_what_the_builder_makes():
    from safetensors.torch import load_file

    stored, built = load_file(str(QWEN_DIFFSYNTH)), qwen_diffsynth_state()
    assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built)
    assert hashlib.sha256(QWEN_DIFFSYNTH.read_bytes()).hexdigest() == REFERENCE["patch_sha256"]
    info = describe_controlnet(QWEN_DIFFSYNTH)
    assert (info.family, info.kind, info.double_blocks, info.hint_channels) == ("qwen-image", "qwen-diffsynth", 3, 16)


@pytest.mark.parametrize(("layout", "case"), _params())
def test_diffsynth_patch_equals_comfy(pool_registry, layout, case):
    model = model_on(layout, pool_registry)
    expected = tensor(f"{case['name']}.expected")
    error = relative_error(run(patched(model, case["applies"]), case), expected)
    assert error <= TOLERANCE, f"{case['name']} on {layout}: {error}"
    if layout == "1rank":  # the patch changes the picture (the test is not vacuous), and so does its order
        assert relative_error(run(model, case), expected) > 100 * TOLERANCE
        if len(case["applies"]) > 1:
            swapped = run(patched(model, case["applies"][::-1]), case)
            assert relative_error(swapped, expected) > 10 * TOLERANCE


def inpaint_patched(model, case, mask: torch.Tensor | None):
    image = tensor(f"hint.{case['hint']}", "inpaint")
    patch = ModelPatch(
        describe_controlnet(QWEN_DIFFSYNTH_INPAINT), image, HintVAE(frame_axis=True), case["strength"], mask
    )
    return patched_model(model, patch)


def test_stored_inpaint_patch_is_what_the_builder_makes():
    from safetensors.torch import load_file

    stored, built = load_file(str(QWEN_DIFFSYNTH_INPAINT)), qwen_diffsynth_inpaint_state()
    assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built)
    assert hashlib.sha256(QWEN_DIFFSYNTH_INPAINT.read_bytes()).hexdigest() == INPAINT["patch_sha256"]
    info = describe_controlnet(QWEN_DIFFSYNTH_INPAINT)
    assert (info.kind, info.double_blocks, info.hint_channels) == ("qwen-diffsynth", 3, 17)


@pytest.mark.parametrize(("layout", "case"), _params(INPAINT))
def test_diffsynth_inpaint_patch_equals_comfy(pool_registry, layout, case):
    """The inpainting patch reads the latent and the area to keep (the mask stretched to the latent; all of it
    without a mask), as ComfyUI's QwenImageDiffsynthControlnet with its optional mask."""
    model = model_on(layout, pool_registry)
    mask = None if case["mask"] is None else tensor(f"mask.{case['mask']}", "inpaint")
    expected = tensor(f"{case['name']}.expected", "inpaint")
    error = relative_error(run(inpaint_patched(model, case, mask), case, "inpaint"), expected)
    assert error <= TOLERANCE, f"{case['name']} on {layout}: {error}"
    if layout == "1rank" and mask is not None:  # the mask changes the picture, and it is the area to keep
        for wrong in (None, 1.0 - mask):
            assert relative_error(run(inpaint_patched(model, case, wrong), case, "inpaint"), expected) > 10 * TOLERANCE


def test_patch_errors_on_the_host(pool_registry):
    case = REFERENCE["cases"][0]
    with pytest.raises(ConfigError, match="PipeFusion"):
        pp = load_parallel_model(
            LoadRequest(model=str(MODEL), devices="cpu:2", layout=ParallelConfig(pp=2), pp_warmup=1), pool_registry
        )
        run(patched(pp, case["applies"]), case)
    inpaint = INPAINT["cases"][0]
    with pytest.raises(ConfigError, match="MASK"):  # a mask without its batch axis
        run(inpaint_patched(model_on("1rank", pool_registry), inpaint, torch.ones(40, 56)), inpaint, "inpaint")


def test_patch_tokens_stay_split_under_ulysses(pool_registry):
    """The patch is token-wise: with it each rank sends exactly what it sends without it (no all-to-all, no
    gather of the hint's tokens)."""
    from tests.dist_jobs.control_jobs import generate_with_stats

    model = model_on("ulysses2", pool_registry)
    case = REFERENCE["cases"][0]
    view = patched(model, case["applies"])
    from parallel_runtime.service.controlnets import with_model_patches

    (positive,) = with_model_patches(view, (1, 16, 8, 12), (CondEntry(Conditioning(tensor("text.pos7"))),))
    settings = SamplingSettings(seed=7, steps=2, cfg=1.0)
    runs = {}
    for name, branch in (("plain", (CondEntry(Conditioning(tensor("text.pos7"))),)), ("patch", positive)):
        per_rank = model.pool.submit(
            generate_with_stats, branch, None, torch.zeros(1, 16, 8, 12), settings, result_rank="all"
        ).result(300)
        runs[name] = [{k: v for k, v in r["sent"].items() if k != "meta"} for r in per_rank]
    assert runs["patch"] == runs["plain"]


# -- the nodes: Parallel Model Patch Loader -> Parallel Qwen-Image DiffSynth ControlNet -> Parallel Sampler ------
def test_diffsynth_nodes_equal_comfy(pool_registry, tmp_path, monkeypatch):
    import shutil

    from pack_import import load_pack  # tests/ helper

    load_pack()
    from dit_parallel_pack.nodes.bridge import ComfyBridge
    from dit_parallel_pack.nodes.context import NodeContext
    from dit_parallel_pack.nodes.loader import ParallelModelLoader
    from dit_parallel_pack.nodes.model_patch import ParallelModelPatchLoader, ParallelQwenImageDiffsynthControlnet
    from dit_parallel_pack.nodes.sampler import ParallelSampler

    (tmp_path / "model_patches").mkdir()
    shutil.copy(QWEN_DIFFSYNTH, tmp_path / "model_patches" / QWEN_DIFFSYNTH.name)
    monkeypatch.setenv("DIT_PARALLEL_MODELS", str(tmp_path))
    ctx = NodeContext.create(registry=pool_registry, bridge=ComfyBridge())
    (handle,) = ParallelModelLoader(ctx).load(
        model=str(MODEL),
        family="auto",
        devices="cpu:2",
        layout="manual",
        ulysses=2,
        ring=1,
        cfg_parallel=1,
        pipefusion=1,
        pp_patches=0,
        pp_warmup=0,
        dtype="fp32",
        attention="auto",
    )["result"]
    (patch,) = ParallelModelPatchLoader(ctx).load_model_patch(QWEN_DIFFSYNTH.name)["result"]
    case = next(c for c in REFERENCE["cases"] if c["name"] == "chained")
    base = handle
    for a in case["applies"]:
        image = tensor(f"hint.{a['hint']}")
        (handle,) = ParallelQwenImageDiffsynthControlnet(ctx).diffsynth_controlnet(
            handle, patch, HintVAE(frame_axis=True), image, a["strength"]
        )["result"]
    out = ParallelSampler(ctx).sample(
        handle,
        [[tensor(f"text.{case['positive']}"), {}]],
        [[tensor(f"text.{case['negative']}"), {}]],
        {"samples": torch.zeros(case["latent_shape"])},
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler_name"],
        case["scheduler"],
        1.0,
    )["result"][0]["samples"]
    assert relative_error(out, tensor(f"{case['name']}.expected")) <= TOLERANCE
    shutil.copy(QWEN_DIFFSYNTH_INPAINT, tmp_path / "model_patches" / QWEN_DIFFSYNTH_INPAINT.name)
    (inpaint,) = ParallelModelPatchLoader(ctx).load_model_patch(QWEN_DIFFSYNTH_INPAINT.name)["result"]
    case = next(c for c in INPAINT["cases"] if c["mask"] is not None and c["cfg"] > 1)
    (masked,) = ParallelQwenImageDiffsynthControlnet(ctx).diffsynth_controlnet(
        base,
        inpaint,
        HintVAE(frame_axis=True),
        tensor(f"hint.{case['hint']}", "inpaint"),
        case["strength"],
        mask=tensor(f"mask.{case['mask']}", "inpaint"),
    )["result"]
    out = ParallelSampler(ctx).sample(
        masked,
        [[tensor(f"text.{case['positive']}", "inpaint"), {}]],
        [[tensor(f"text.{case['negative']}", "inpaint"), {}]],
        {"samples": torch.zeros(case["latent_shape"])},
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler_name"],
        case["scheduler"],
        1.0,
    )["result"][0]["samples"]
    assert relative_error(out, tensor(f"{case['name']}.expected", "inpaint")) <= TOLERANCE
    with pytest.raises(ConfigError, match="Parallel Model Patch Loader"):
        ParallelQwenImageDiffsynthControlnet(ctx).diffsynth_controlnet(handle, object(), HintVAE(), image, 1.0)
