"""Parallel EasyCache / LazyCache skip the steps ComfyUI's EasyCache / LazyCache skip and give its picture.

Oracle: tests/data/comfy_easycache_reference.json, written by tests/data/make_comfy_easycache_reference.py with
ComfyUI 0.3.64's own EasyCache / LazyCache nodes and KSampler on the tiny Flux files of the KSampler reference
(loaded here through our single-file path on real CPU worker pools: every case on one rank, the cases that
exercise each layout on Ulysses 2 and CFG 2). Every rank reports its decisions; all of them must be ComfyUI's.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.denoise.caching.specs import StepCacheSpec
from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.caches import ParallelEasyCache, ParallelLazyCache  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_easycache_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4  # relative L2 against ComfyUI's latent
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
}
NODES = {"EasyCache": ParallelEasyCache, "LazyCache": ParallelLazyCache}
# every case on one rank; on two ranks the cases that exercise each layout's part of the rule
PARALLEL_CASES = {
    "ulysses2": ("easycache_cfg2", "easycache_heun", "lazycache_cfg1", "lazycache_cfg2"),
    "cfg2": ("easycache_cfg2", "easycache_window", "easycache_heun", "lazycache_cfg2"),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def conditioning(branch: dict) -> Conditioning:
    return Conditioning(tensor(branch["embeds"]), tensor(branch["pooled"]))


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape
    return float((got.float() - expected).norm() / expected.norm())


def skipped(summaries: list[dict]) -> list[int]:
    (summary,) = summaries
    return [evaluation for evaluation, was_skipped in summary["trace"] if was_skipped]


def _params():
    for layout in LAYOUTS:
        for case in REFERENCE["cases"]:
            if layout in PARALLEL_CASES and case["name"] not in PARALLEL_CASES[layout]:
                continue
            assert not (layout == "cfg2" and math.isclose(case["cfg"], 1.0))  # CFG parallel needs a negative
            yield pytest.param(layout, case, id=f"{layout}-{case['name']}")


def load(registry, case: dict, layout: str):
    devices, config = LAYOUTS[layout]
    path = DATA / REFERENCE["models"][case["model"]]
    return load_parallel_model(LoadRequest(model=str(path), devices=devices, layout=config), registry)


def sample(model, case: dict, events: list) -> torch.Tensor:
    latent = case["latent"]
    return model.sample(
        conditioning(case["positive"]),
        conditioning(case["negative"]),
        None,
        latent["width"],
        latent["height"],
        seed=case["seed"],
        steps=case["steps"],
        cfg=case["cfg"],
        sampler_name=case["sampler_name"],
        scheduler=case["scheduler"],
        on_event=lambda rank, kind, payload: events.append((rank, kind, payload)),
    )


@pytest.mark.parametrize(("layout", "case"), list(_params()))
def test_same_skipped_steps_and_picture_as_comfy(pool_registry, layout, case):
    kind = {"EasyCache": "easycache", "LazyCache": "lazycache"}[case["node"]]
    model = load(pool_registry, case, layout).with_cache(StepCacheSpec(kind, **case["inputs"]))
    events: list = []
    out = sample(model, case, events)
    reports = {rank: payload for rank, kind_, payload in events if kind_ == "cache"}
    assert sorted(reports) == list(range(model.config.world_size))  # every rank reported its decisions
    for rank, summaries in reports.items():
        assert skipped(summaries) == case["skipped_evaluations"], (layout, case["name"], rank)
        assert summaries[0]["evaluations"] == case["evaluations"]
    error = relative_error(out, tensor(case["expected"]))
    assert error <= TOLERANCE, (layout, case["name"], error)


@pytest.mark.parametrize("name", ["easycache_cfg2", "lazycache_cfg2"])
def test_the_nodes_give_comfy_s_picture(pool_registry, name):
    """Loader -> Parallel EasyCache / LazyCache -> Parallel Sampler, as a graph wires them (Ulysses 2)."""
    case = next(c for c in REFERENCE["cases"] if c["name"] == name)
    ctx = NodeContext.create(registry=pool_registry, bridge=ComfyBridge())
    result = ParallelModelLoader(ctx).load(
        model=str(DATA / REFERENCE["models"][case["model"]]),
        family="auto",
        devices="cpu:2",
        layout="manual",
        ulysses=2,
        ring=1,
        cfg_parallel=1,
        pipefusion=1,
        pp_patches=0,
        pp_warmup=1,
        dtype="fp32",
        attention="auto",
    )
    (handle,) = result["result"]
    cached = NODES[case["node"]]().patch(handle, **case["inputs"])
    assert case["node"] in cached["ui"]["text"][0]
    (handle,) = cached["result"]
    comfy_cond = lambda b: [[tensor(b["embeds"]), {"pooled_output": tensor(b["pooled"])}]]  # noqa: E731
    latent = {"samples": torch.zeros(1, 4, case["latent"]["height"] // 8, case["latent"]["width"] // 8)}
    out = ParallelSampler(ctx).sample(
        handle,
        comfy_cond(case["positive"]),
        comfy_cond(case["negative"]),
        latent,
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler_name"],
        case["scheduler"],
        1.0,
    )
    assert relative_error(out["result"][0]["samples"], tensor(case["expected"])) <= TOLERANCE
    shown = out["ui"]["text"][0]
    evaluations = case["evaluations"]
    assert f"{case['node']} skipped {len(case['skipped_evaluations'])}/{evaluations} evaluations" in shown


@pytest.mark.parametrize("node", sorted(NODES))
def test_cache_nodes_take_comfy_s_inputs(node):
    """Same input names, defaults and ranges as ComfyUI's EasyCache / LazyCache."""
    ours = NODES[node].INPUT_TYPES()["required"]
    assert ours.pop("parallel_model")[0] == "PARALLEL_MODEL"
    stripped = {k: {o: x for o, x in v[1].items() if o != "tooltip"} for k, v in ours.items()}
    assert stripped == REFERENCE["node_inputs"][node]
