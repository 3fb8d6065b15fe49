"""Inpainting with a LATENT noise mask (SetLatentNoiseMask / VAEEncodeForInpaint) on an image model, every
layout: the Parallel Sampler (node and API) against ComfyUI 0.3.64's own SetLatentNoiseMask + KSampler.

Oracle: tests/data/comfy_inpaint_reference.json (tests/data/make_comfy_inpaint_reference.py, on the tiny
Flux dev file of the KSampler reference). One rank, Ulysses 2, CFG 2 (cases with cfg > 1) and PipeFusion 2
with every step synchronous (exact) equal ComfyUI's; PipeFusion with patches (the mask cut with the row
bands, stale K/V) keeps the unmasked pixels exactly and stays close to its single device.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.loop import prepare_denoise_mask
from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_inpaint_reference.json").read_text(encoding="utf-8"))
CASES = {c["name"]: c for c in REFERENCE["cases"]}
TOLERANCE = 1e-4  # relative L2, as the KSampler fidelity tests
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def comfy_conditioning(case: dict, role: str) -> list:
    options = {"pooled_output": tensor(f"{case['name']}.{role}.pooled")}
    if role == "positive" and "guidance" in case:
        options["guidance"] = case["guidance"]
    return [[tensor(f"{case['name']}.{role}.embeds"), options]]


def api_branch(case: dict, role: str) -> tuple[CondEntry, ...]:
    ((embeds, options),) = comfy_conditioning(case, role)
    return (CondEntry(Conditioning(embeds, options["pooled_output"]), guidance=options.get("guidance")),)


def node_latent(case: dict) -> dict:
    mask = tensor(f"{case['name']}.mask")
    return {"samples": tensor(f"{case['name']}.samples"), "noise_mask": mask.reshape(-1, 1, *mask.shape[-2:])}


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape
    return float((got.float() - expected).norm() / expected.norm())


def settings(case: dict) -> dict:
    keys = ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")
    return {k: case[k] for k in keys}


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def load_node(ctx: NodeContext, layout: str, warmup: int):
    devices, config = LAYOUTS[layout]
    (handle,) = ParallelModelLoader(ctx).load(
        model=str(DATA / REFERENCE["model"]), family="auto", devices=devices, layout="manual",
        ulysses=config.ulysses, ring=1, cfg_parallel=config.cfg, pipefusion=config.pp, pp_patches=0,
        pp_warmup=warmup, dtype="fp32", attention="auto",
    )["result"]  # fmt: skip
    return handle


def run_api(registry, layout: str, case: dict, warmup: int | None = None, mask: bool = True) -> torch.Tensor:
    devices, config = LAYOUTS[layout]
    request = LoadRequest(
        model=str(DATA / REFERENCE["model"]), devices=devices, layout=config, pp_warmup=warmup or case["steps"]
    )
    model = load_parallel_model(request, registry)
    latent = tensor(f"{case['name']}.samples")
    return model.sample(
        api_branch(case, "positive"),
        api_branch(case, "negative"),
        latent,
        latent.shape[-1] * 8,
        latent.shape[-2] * 8,
        noise_mask=tensor(f"{case['name']}.mask") if mask else None,
        **settings(case),
    )


def _params():
    for layout in LAYOUTS:
        for case in REFERENCE["cases"]:
            if layout == "cfg2" and math.isclose(case["cfg"], 1.0):
                continue
            yield pytest.param(layout, case, id=f"{layout}-{case['name']}")


@pytest.mark.parametrize(("layout", "case"), list(_params()))
def test_inpainting_equals_comfy_ksampler(node_ctx, pool_registry, layout, case):
    expected = tensor(f"{case['name']}.expected")
    handle = load_node(node_ctx, layout, warmup=case["steps"])
    latent_in = node_latent(case)
    (latent_out,) = ParallelSampler(node_ctx).sample(
        handle, comfy_conditioning(case, "positive"), comfy_conditioning(case, "negative"), latent_in,
        **settings(case),
    )["result"]  # fmt: skip
    api_out = run_api(pool_registry, layout, case)
    errors = {"node": relative_error(latent_out["samples"], expected), "api": relative_error(api_out, expected)}
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} on {layout}: {errors}"
    assert latent_out["noise_mask"] is latent_in["noise_mask"]  # KSampler's copy keeps the mask


def kept(case: dict) -> torch.Tensor:
    """Where the prepared mask is 0 at the latent's size: KSampler keeps the input latent there."""
    samples = tensor(f"{case['name']}.samples")
    return prepare_denoise_mask(tensor(f"{case['name']}.mask"), tuple(samples.shape)) == 0


@pytest.mark.parametrize("name", ["inpaint_euler", "inpaint_cfg_denoise"])
def test_pipefusion_patches_keep_the_unmasked_latent(pool_registry, name):
    """PipeFusion with row-band patches after one synchronous step: the mask is cut with the bands. Outside
    the mask the result is the input latent (ComfyUI's rule, which ComfyUI's own result obeys too); inside,
    it stays close to the single device (stale K/V); without the mask the kept pixels would change."""
    case = CASES[name]
    latent, expected = tensor(f"{name}.samples"), tensor(f"{name}.expected")
    where = kept(case)
    assert where.any() and not where.all()
    torch.testing.assert_close(expected[where], latent[where], rtol=0, atol=1e-5)  # ComfyUI's own rule
    patched = run_api(pool_registry, "pipefusion2", case, warmup=1)
    torch.testing.assert_close(patched[where], latent[where], rtol=0, atol=1e-5)
    assert relative_error(patched, expected) < 0.05  # stale K/V after warmup
    unmasked = run_api(pool_registry, "pipefusion2", case, warmup=1, mask=False)
    assert (unmasked[where] - latent[where]).abs().max() > 0.1
