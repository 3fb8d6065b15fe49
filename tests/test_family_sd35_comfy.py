"""Same picture as ComfyUI's KSampler on SD3.5 Large and Medium files: the Parallel Sampler, through its node and
through the API, against ComfyUI 0.3.64's own KSampler (UNETLoader's MMDiT with RMS q/k norms; Medium's MMDiT-X
dual-attention blocks; ModelSamplingSD3) on the same single files in Stability's layout (``model.diffusion_model.``
names), on one rank, Ulysses 2, CFG 2 and PipeFusion 2 (warmup = steps: exact); the files are told apart as ComfyUI
detects them.

Oracle: tests/data/comfy_sd35_reference.json and comfy_ref_sd35_{large,medium}.safetensors, written by
tests/data/make_comfy_sd35_reference.py from the ComfyUI snapshot.
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
from parallel_runtime.denoise.model_sampling import model_sampling_sd3_node
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.single_file import inspect_single_file
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.model_sampling import ParallelModelSamplingSD3  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_sd35_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4  # relative L2, as tests/test_ksampler_fidelity.py
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
VARIANTS = {"sd35_large": "sd3.5-large", "sd35_medium": "sd3.5-medium"}
# Every case runs on one rank against ComfyUI. Samplers, schedules and ModelSamplingSD3 act on the whole latent on
# the host, the same on every layout, so a parallel layout runs the cases whose model pass it splits differently:
# the default one per variant, and on Ulysses the odd size (padded tokens). PipeFusion takes whole 16 px tokens.
PARALLEL_CASES = {
    "ulysses2": ("_default_euler", "_odd_size"),
    "cfg2": ("_default_euler",),
    "pipefusion2": ("_default_euler",),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def file_of(model: str) -> Path:
    return DATA / REFERENCE["models"][model]["file"]


def _params() -> list:
    params = []
    for layout in LAYOUTS:
        for case in REFERENCE["cases"]:
            if layout == "cfg2" and math.isclose(case["cfg"], 1.0):
                continue  # one branch: nothing to split
            if layout != "1rank" and not case["name"].endswith(PARALLEL_CASES[layout]):
                continue
            params.append(pytest.param(layout, case, id=f"{layout}-{case['name']}"))
    return params


def comfy_conditioning(entries: list[dict]) -> list:
    """The CONDITIONING TripleCLIPLoader + CLIPTextEncode give: token states and the pooled CLIP vectors."""
    return [[tensor(e["embeds"]), {"pooled_output": tensor(e["pooled"])}] for e in entries]


def api_branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(CondEntry(Conditioning(tensor(e["embeds"]), tensor(e["pooled"]))) for e in entries)


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm().clamp_min(1e-30))


@pytest.mark.parametrize(("layout", "case"), _params())
def test_parallel_sampler_equals_comfy_ksampler(node_ctx, pool_registry, layout, case):
    devices, config = LAYOUTS[layout]
    path, steps = str(file_of(case["model"])), case["steps"]
    degrees = dict(ulysses=config.ulysses, ring=1, cfg_parallel=config.cfg, pipefusion=config.pp)
    (handle,) = ParallelModelLoader(node_ctx).load(
        model=path,
        family="auto",
        devices=devices,
        layout="manual",
        **degrees,
        pp_patches=0,
        pp_warmup=steps,
        dtype="fp32",
        attention="auto",
    )["result"]
    model = load_parallel_model(LoadRequest(model=path, devices=devices, layout=config, pp_warmup=steps), pool_registry)
    node = case["model_sampling"]
    if node is not None:
        assert node["node"] == "ModelSamplingSD3"
        handle = ParallelModelSamplingSD3().patch(handle, **node["inputs"])["result"][0]
        model = model.with_model_sampling(model_sampling_sd3_node(**node["inputs"]))
    latent = tensor(case["latent"]["samples"])
    settings = (case["seed"], steps, case["cfg"], case["sampler_name"], case["scheduler"], case["denoise"])
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
