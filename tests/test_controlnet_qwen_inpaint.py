"""The InstantX Qwen-Image inpainting ControlNet (68 hint values per token: the hint latent's 64 and a mask
channel's 4) on the worker pool, against ComfyUI 0.3.64's own graph. Oracle:
tests/data/comfy_qwen_controlnet_inpaint_reference.json, written by
tests/data/make_comfy_qwen_controlnet_inpaint_reference.py (ControlNetLoader -> ControlNetInpaintingAliMamaApply,
or ControlNetApplyAdvanced without a mask -> KSampler, on the tiny Qwen-Image and tests/controlnet_files.py's tiny
68-value file). The apply node's own calls on the CONTROL_NET (the masked image and the kept-area mask it passed
as ``extra_concat``) are stored; here Parallel ControlNet Loader's CONTROL_NET gets exactly those and goes into
the Parallel Sampler node on real CPU pools: one rank, Ulysses 2, CFG 2, PipeFusion 2 (every step a warmup step).
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
from comfy_ksampler_cases import load_manual, sample_zeros  # tests/ helper
from controlnet_files import QWEN_INSTANTX_INPAINT, qwen_instantx_state  # tests/ helper
from pack_import import load_pack  # tests/ helper

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.controlnet_files import describe_controlnet
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.comfy_control import controlnet

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from controlnet_hint_vae import HintVAE  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_qwen_controlnet_inpaint_reference.json").read_text(encoding="utf-8"))
MODEL = DATA / REFERENCE["model_file"]
CASES = {case["name"]: case for case in REFERENCE["cases"]}
TOLERANCE = 1e-4  # relative L2
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def graph_conditioning(case: dict, masks: list | None = None):
    """What the apply node leaves on the conditionings: one configured copy on both branches (``masks``: other
    ``extra_concat`` than the node's, to show the mask matters)."""
    net, _ = controlnet(str(QWEN_INSTANTX_INPAINT))  # what Parallel ControlNet Loader hands on
    assert net.concat_mask  # what ControlNetInpaintingAliMamaApply reads to pass its mask
    if masks is None:
        masks = [tensor(f"{case['name']}.extra_concat.{k}") for k in range(case["extra_concat"])]
    vae = HintVAE(frame_axis=True)
    window = (case["start_percent"], case["end_percent"])
    made = net.copy().set_cond_hint(tensor(f"{case['name']}.cond_hint"), case["strength"], window, vae, masks)
    positive = [[tensor(f"text.{case['positive']}"), {"control": made, "control_apply_to_uncond": False}]]
    negative = [[tensor(f"text.{case['negative']}"), {"control": made, "control_apply_to_uncond": False}]]
    return positive, negative, vae


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def run_graph(ctx, handle, case, masks=None):
    positive, negative, vae = graph_conditioning(case, masks)
    return sample_zeros(ctx, handle, positive, negative, case), vae


def _params():
    return [
        pytest.param(layout, name, id=f"{layout}-{name}")
        for layout in LAYOUTS
        for name, case in CASES.items()
        if not (layout == "cfg2" and math.isclose(case["cfg"], 1.0))
    ]


def test_stored_file_is_the_inpainting_layout():
    from safetensors.torch import load_file

    stored, built = load_file(str(QWEN_INSTANTX_INPAINT)), qwen_instantx_state(mask_values=4)
    assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built)
    assert stored["controlnet_x_embedder.weight"].shape[1] == 68
    assert hashlib.sha256(QWEN_INSTANTX_INPAINT.read_bytes()).hexdigest() == REFERENCE["controlnet_sha256"]
    assert hashlib.sha256(MODEL.read_bytes()).hexdigest() == REFERENCE["model_sha256"]
    info = describe_controlnet(QWEN_INSTANTX_INPAINT)
    assert (info.family, info.double_blocks, info.hint_channels, info.mask_channels) == ("qwen-image", 2, 17, 1)
    assert info.hint_format.channels == 16  # Wan 2.1's statistics apply to the latent's channels only


@pytest.mark.parametrize(("layout", "name"), _params())
def test_parallel_sampler_with_qwen_inpaint_controlnet_equals_comfy(node_ctx, layout, name):
    case = CASES[name]
    handle = load_node(node_ctx, layout)
    got, vae = run_graph(node_ctx, handle, case)
    expected = tensor(f"{name}.expected")
    error = relative_error(got, expected)
    assert error <= TOLERANCE, f"{name} on {layout}: {error}"
    assert vae.calls == case["vae_encode_calls"]
    if layout == "1rank" and case["extra_concat"]:  # the mask channel changes the picture (not vacuous)
        kept_all, _ = run_graph(node_ctx, handle, case, masks=[])
        assert relative_error(kept_all, expected) > 100 * TOLERANCE


def test_mask_on_a_plain_controlnet_is_refused():
    from controlnet_files import QWEN_INSTANTX

    net, _ = controlnet(str(QWEN_INSTANTX))
    assert not net.concat_mask
    with pytest.raises(ConfigError, match="only an inpainting ControlNet reads a mask"):
        net.copy().set_cond_hint(torch.zeros(1, 3, 8, 8), extra_concat=[torch.ones(1, 1, 8, 8)])


def load_node(ctx: NodeContext, layout: str):
    devices, config = LAYOUTS[layout]
    return load_manual(ctx, str(MODEL), devices, config, warmup=0)


def test_qwen_inpaint_controlnet_under_pipefusion_equals_comfy_after_full_warmup(node_ctx):
    """PipeFusion 2, every step a warmup step: stage 0 runs the inpainting ControlNet on each item (its hint's mask
    channel cut with the item's tokens) and sends the later stage's residuals with it; each case equals ComfyUI."""
    handle = load_manual(node_ctx, str(MODEL), "cpu:2", ParallelConfig(pp=2), warmup=5)
    for name, case in CASES.items():
        assert case["steps"] <= 5
        error = relative_error(run_graph(node_ctx, handle, case)[0], tensor(f"{name}.expected"))
        assert error <= TOLERANCE, f"{name} under PipeFusion 2: {error}"
