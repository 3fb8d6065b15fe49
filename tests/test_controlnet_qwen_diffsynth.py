"""DiffSynth Qwen-Image ControlNet model patches on the worker pool, against ComfyUI 0.3.64's own graph. Oracle:
tests/data/comfy_qwen_diffsynth_reference.json, written by tests/data/make_comfy_qwen_diffsynth_reference.py
(ModelPatchLoader -> QwenImageDiffsynthControlnet with the hint VAE -> KSampler, on the tiny Qwen-Image file and
tests/controlnet_files.py's tiny patch). Here the same file and image go through ``service.controlnets.patched_model``
(what Parallel Qwen-Image DiffSynth ControlNet calls) on real CPU pools: one rank, Ulysses 2, CFG 2; chained
patches apply in order; the patch's tokens stay split under Ulysses (nothing gathered, no extra all-to-all).
Under PipeFusion (pp 2, cfg 2 x pp 2, pp 2 x Ulysses 2) each stage applies its blocks' patches to the patch's own tokens: equal to
ComfyUI after a full warmup, close with stale K/V, each token once per step per block, no extra bytes.
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
from comfy_ksampler_cases import frames_relative_error as relative_error  # tests/ helper
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
from parallel_runtime.service.controlnets import ModelPatch, patched_model, with_model_patches

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
    (positive,) = with_model_patches(view, (1, 16, 8, 12), (CondEntry(Conditioning(tensor("text.pos7"))),))
    settings = SamplingSettings(seed=7, steps=2, cfg=1.0)
    runs = {}
    for name, branch in (("plain", (CondEntry(Conditioning(tensor("text.pos7"))),)), ("patch", positive)):
        per_rank = model.pool.submit(
            generate_with_stats, branch, None, torch.zeros(1, 16, 8, 12), settings, result_rank="all"
        ).result(300)
        runs[name] = [{k: v for k, v in r["sent"].items() if k != "meta"} for r in per_rank]
    assert runs["patch"] == runs["plain"]


# -- PipeFusion: each stage applies its blocks' patches to the patch's own tokens --------------------------------
# Stale K/V (warmup 1, the "chained" case) as a share of the seed difference: measured 0.0063 (2 patches) and
# 0.0083 (4); the same case without the patches 0.0067 and 0.0094 (the edit models' bound).
PP_STALE_BOUND = 0.02


def pp_job(model, case, seed=None, with_patches=True):
    """(positive, negative, latent, settings) of ``case`` with its patches attached, as the sampler sends them."""
    shape = tuple(case["latent_shape"])
    entry = lambda name: (CondEntry(Conditioning(tensor(f"text.{name}"))),)  # noqa: E731
    view = patched(model, case["applies"]) if with_patches else model
    pos, neg = with_model_patches(view, shape, entry(case["positive"]), entry(case["negative"]))
    settings = SamplingSettings(
        seed=case["seed"] if seed is None else seed, steps=case["steps"], cfg=case["cfg"],
        sampler=case["sampler_name"], scheduler=case["scheduler"],
    )  # fmt: skip
    return pos, neg, torch.zeros(shape), settings


def pp_run(model, job, warmup: int, patches: int | None = None):
    """(latent, per-rank PipeFusionStats) of a PipeFusion run of ``job`` on ``model``'s pool."""
    from parallel_runtime.tools.bench_pipefusion import generate_with_stats

    per_rank = model.pool.submit(generate_with_stats, *job, patches, warmup, result_rank="all").result(300)
    return per_rank[0]["latent"], [r["stats"] for r in per_rank]


PP_LAYOUTS = {
    "pp2": ParallelConfig(pp=2),
    "cfg2xpp2": ParallelConfig(cfg=2, pp=2),
    "pp2xulysses2": ParallelConfig(pp=2, ulysses=2),
}


@pytest.mark.parametrize("config", list(PP_LAYOUTS.values()), ids=list(PP_LAYOUTS))
def test_diffsynth_under_pipefusion_equals_comfy_after_full_warmup_and_stays_close_with_stale_kv(pool_registry, config):
    """Every step a warmup step: each case through the sampler API equals ComfyUI's graph to 1e-4 (chained
    patches in order, strengths, cfg 1 and both CFG branches, the inpainting patch with its masks; on the hybrids, where each CFG rank runs its own
    branch's patches, or each stage splits the patch's tokens and their hint tokens over Ulysses, two chained). Warmup 1 (stale K/V of the other patches, as for
    the plain model): within PP_STALE_BOUND of the seed-to-seed difference, and not equal (the patches ran)."""
    model = load_parallel_model(
        LoadRequest(model=str(MODEL), devices=f"cpu:{config.world_size}", layout=config, pp_warmup=4), pool_registry
    )
    cases = REFERENCE["cases"] if config.world_size == 2 else [c for c in REFERENCE["cases"] if c["name"] == "chained"]
    for case in cases:
        assert case["steps"] <= 4
        error = relative_error(run(patched(model, case["applies"]), case), tensor(f"{case['name']}.expected"))
        assert error <= TOLERANCE, f"{case['name']} on {config}: {error}"
    if config.world_size > 2:  # the hybrids: one case (two chained patches, both branches)
        return
    for case in INPAINT["cases"]:  # the inpainting patch: its mask channel rides in the hint, cut per patch too
        mask = None if case["mask"] is None else tensor(f"mask.{case['mask']}", "inpaint")
        expected = tensor(f"{case['name']}.expected", "inpaint")
        error = relative_error(run(inpaint_patched(model, case, mask), case, "inpaint"), expected)
        assert error <= TOLERANCE, f"inpaint {case['name']} on {config}: {error}"
    case = next(c for c in REFERENCE["cases"] if c["name"] == "chained")
    expected = tensor(f"{case['name']}.expected")
    shifted, _ = pp_run(model, pp_job(model, case, seed=case["seed"] + 1), warmup=case["steps"])
    yardstick = float((shifted.reshape(expected.shape) - expected).abs().mean())
    for patches in (2, 4):
        stale, _ = pp_run(model, pp_job(model, case), warmup=1, patches=patches)
        error = float((stale.reshape(expected.shape) - expected).abs().mean()) / yardstick
        assert 0 < error < PP_STALE_BOUND, (patches, error)


def test_diffsynth_under_pipefusion_runs_each_token_once_per_step_on_its_stage_and_sends_nothing_more(
    pool_registry,
):
    """Each stage runs its blocks' patches on the patch's own tokens: over a run every stage's count is
    streams x links x image tokens x steps x its blocks, with 2 or 4 patches as with every step on the whole
    image (a stage that ran the patches on the whole image for every patch would count patches x more). Nothing
    of the ControlNet crosses a stage boundary: every rank sends exactly the bytes of the run without it. Each stage
    holds only the patch blocks of its own blocks."""
    model = load_parallel_model(
        LoadRequest(model=str(MODEL), devices="cpu:2", layout=ParallelConfig(pp=2), pp_warmup=4), pool_registry
    )
    case = next(c for c in REFERENCE["cases"] if c["name"] == "chained")  # two links; texts of 7 and 5: 2 streams
    shape, steps = case["latent_shape"], case["steps"]
    tokens = shape[-2] // 2 * (shape[-1] // 2)
    per_block = 2 * len(case["applies"]) * tokens * steps
    blocks = {0: None, 1: None}
    for patches in (2, 4):
        _, stats = pp_run(model, pp_job(model, case), warmup=1, patches=patches)
        _, plain = pp_run(model, pp_job(model, case, with_patches=False), warmup=1, patches=patches)
        counts = {s.stage: s.control_tokens for s in stats}
        for s in stats:
            blocks[s.stage] = counts[s.stage] // per_block
        assert all(n > 0 and n % per_block == 0 for n in counts.values()), counts
        assert sum(blocks.values()) == 3, blocks  # the tiny model's 3 blocks, each on one stage
        assert [s.sent_bytes for s in stats] == [s.sent_bytes for s in plain]
        assert sum(s.sent_bytes.get("pp_act", 0) for s in stats) > 0
    _, whole = pp_run(model, pp_job(model, case), warmup=steps)
    assert {s.stage: s.control_tokens for s in whole} == counts
    from tests.dist_jobs.control_jobs import held_patch_blocks

    held = model.pool.submit(held_patch_blocks, str(QWEN_DIFFSYNTH), result_rank="all").result(300)
    assert [len(h) for h in held] == [blocks[0], blocks[1]] and sorted(held[0] + held[1]) == [0, 1, 2], held


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
