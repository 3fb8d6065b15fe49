"""Same picture as ComfyUI's KSampler on a Chroma file: the Parallel Sampler, through its node and through the
API, against ComfyUI 0.3.64's own KSampler (UNETLoader's Chroma, FluxGuidance, EmptyLatentImage) on the same
original-layout file, on one rank, Ulysses 2, CFG 2 and PipeFusion 2 (warmup = steps: exact).

Oracle: tests/data/comfy_chroma_reference.json and comfy_ref_chroma.safetensors, written by
tests/data/make_comfy_chroma_reference.py from the ComfyUI snapshot.
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
from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_chroma_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["models"]["chroma"]["file"]
TOLERANCE = 1e-4  # relative L2, as tests/test_ksampler_fidelity.py
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
STEPS = max(case["steps"] for case in REFERENCE["cases"])
# Every case runs on one rank against ComfyUI. Samplers, schedules, guidance and denoise act the same on every
# layout, so a parallel layout runs the cases its model pass splits differently: the default one; on Ulysses the odd
# size (padded tokens); on CFG 2 equal text lengths (the branches batch). PipeFusion takes whole 16 px tokens.
PARALLEL_CASES = {
    "ulysses2": ("chroma_default_euler", "chroma_odd_size"),
    "cfg2": ("chroma_default_euler", "chroma_same_lengths_dpmpp_2m"),
    "pipefusion2": ("chroma_default_euler",),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def _params() -> list:
    params = []
    for layout in LAYOUTS:
        for case in REFERENCE["cases"]:
            if layout == "cfg2" and math.isclose(case["cfg"], 1.0):
                continue  # one branch: nothing to split
            if layout != "1rank" and case["name"] not in PARALLEL_CASES[layout]:
                continue
            params.append(pytest.param(layout, case, id=f"{layout}-{case['name']}"))
    return params


def comfy_conditioning(entries: list[dict]) -> list:
    """The CONDITIONING CLIPTextEncode (+ FluxGuidance) gives for a T5-only model: pooled_output None."""
    return [[tensor(e["embeds"]), {"pooled_output": None, **({"guidance": e["guidance"]} if "guidance" in e else {})}]
            for e in entries]  # fmt: skip


def api_branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(CondEntry(Conditioning(tensor(e["embeds"])), guidance=e.get("guidance")) for e in entries)


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm().clamp_min(1e-30))


@pytest.mark.parametrize(("layout", "case"), _params())
def test_parallel_sampler_equals_comfy_ksampler(node_ctx, pool_registry, layout, case):
    devices, config = LAYOUTS[layout]
    degrees = dict(ulysses=config.ulysses, ring=1, cfg_parallel=config.cfg, pipefusion=config.pp)
    (handle,) = ParallelModelLoader(node_ctx).load(
        model=str(FILE),
        family="auto",
        devices=devices,
        layout="manual",
        **degrees,
        pp_patches=0,
        pp_warmup=STEPS,
        dtype="fp32",
        attention="auto",
    )["result"]
    model = load_parallel_model(
        LoadRequest(model=str(FILE), devices=devices, layout=config, pp_warmup=STEPS), pool_registry
    )
    latent = tensor(case["latent"]["samples"])
    settings = (case["seed"], case["steps"], case["cfg"], case["sampler_name"], case["scheduler"], case["denoise"])
    result = ParallelSampler(node_ctx).sample(
        handle,
        comfy_conditioning(case["positive"]),
        comfy_conditioning(case["negative"]),
        {"samples": latent},
        *settings,
    )
    api = model.sample(
        api_branch(case["positive"]),
        api_branch(case["negative"]),
        latent,
        latent.shape[-1] * 8,
        latent.shape[-2] * 8,
        **dict(zip(("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise"), settings)),
    )
    expected = tensor(case["expected"]["samples"])
    errors = {"node": relative_error(result["result"][0]["samples"], expected), "api": relative_error(api, expected)}
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} ({case['what']}) on {layout}: {errors}"


def test_model_sampling_and_latent_format_are_comfyuis(pool_registry):
    """What ComfyUI derives from the file (supported_models.Chroma): ModelSamplingFlux shift 1.15, Flux latents."""
    comfy = REFERENCE["models"]["chroma"]["comfy"]
    assert (comfy["model_type"], comfy["model_sampling"]) == ("FLUX", "ModelSamplingFlux")
    model = load_parallel_model(LoadRequest(model=str(FILE), devices="cpu:1"), pool_registry)
    spec = model.model_sampling
    assert spec.kind == "flux_flow" and spec.shift == pytest.approx(comfy["shift"])
    from parallel_runtime.denoise.model_sampling import build_model_sampling

    ms = build_model_sampling(spec)
    assert float(ms.sigma_min) == pytest.approx(comfy["sigma_min"], rel=1e-6)
    assert float(ms.sigma_max) == pytest.approx(comfy["sigma_max"], rel=1e-6)
    from parallel_runtime.models.families.registry import family

    fmt = family("chroma").adapter().make_plan(model_config(), None).latent_format
    assert (fmt.scale, fmt.shift) == pytest.approx((comfy["latent_format"]["scale"], comfy["latent_format"]["shift"]))


def model_config():
    from parallel_runtime.models.single_file import inspect_single_file

    class Config(dict):
        __getattr__ = dict.get

    return Config(inspect_single_file(FILE).config)
