"""The runner shared by the tests that sample a single file as ComfyUI's KSampler did (tests/test_family_*_comfy.py):
a stored reference's tensors, which layout runs which case, and one case sampled both ways (the Parallel Sampler
node on ComfyUI's CONDITIONING, and the API) with each way's relative error to ComfyUI's samples. Each test file
keeps its cases, its conditioning and its oracle."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.model_sampling import ParallelModelSamplingSD3  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

TOLERANCE = 1e-4  # relative L2, as tests/test_ksampler_fidelity.py
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
SETTINGS = ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")


def tensor_reader(reference: Mapping[str, Any]) -> Callable[[str], torch.Tensor]:
    """``name`` -> the reference's stored tensor (float32, read once)."""

    @functools.cache
    def tensor(name: str) -> torch.Tensor:
        t = reference["tensors"][name]
        return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])

    return tensor


def layout_params(cases: list[dict], layouts: Mapping[str, Any], on_parallel: Callable[[str, str], bool]) -> list:
    """(layout, case) parameters: one rank runs every case, a parallel layout those ``on_parallel(layout, case
    name)`` picks; CFG 2 never a case of cfg 1 (one branch: nothing to split)."""
    params = []
    for layout in layouts:
        for case in cases:
            if layout == "cfg2" and math.isclose(case["cfg"], 1.0):
                continue
            if layout != "1rank" and not on_parallel(layout, case["name"]):
                continue
            params.append(pytest.param(layout, case, id=f"{layout}-{case['name']}"))
    return params


def node_context(pool_registry) -> NodeContext:
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm().clamp_min(1e-30))


def frames_relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """``relative_error`` of an image latent [B,16,H,W] against ComfyUI's stored [B,16,1,H,W] (Qwen-Image's)."""
    return relative_error(got.reshape(expected.shape) if got.numel() == expected.numel() else got, expected)


def load_manual(ctx: NodeContext, model: str, devices: str, config: ParallelConfig, warmup: int = 1):
    """The Parallel Model Loader's model of ``model`` (fp32) on ``devices`` in the manual layout ``config``."""
    result = ParallelModelLoader(ctx).load(
        model=model,
        family="auto",
        devices=devices,
        layout="manual",
        ulysses=config.ulysses,
        ring=config.ring,
        cfg_parallel=config.cfg,
        pipefusion=config.pp,
        pp_patches=0,
        pp_warmup=warmup,
        dtype="fp32",
        attention="auto",
    )
    return result["result"][0]


def sample_zeros(ctx: NodeContext, handle, positive: list, negative: list, case: dict) -> torch.Tensor:
    """The Parallel Sampler's samples of ``case`` (its seed, steps, cfg, sampler, scheduler; full denoise) from a zero
    latent of ``case["latent_shape"]``."""
    latent = {"samples": torch.zeros(case["latent_shape"])}
    settings = (case["seed"], case["steps"], case["cfg"], case["sampler_name"], case["scheduler"], 1.0)
    return ParallelSampler(ctx).sample(handle, positive, negative, latent, *settings)["result"][0]["samples"]


def sample_both_ways(
    node_ctx: NodeContext,
    pool_registry,
    path: str,
    layout: tuple[str, ParallelConfig],
    case: dict,
    warmup: int,
    tensor: Callable[[str], torch.Tensor],
    comfy_conditioning: Callable[[list[dict]], list],
    api_branch: Callable[[list[dict]], tuple],
    model_sampling_sd3: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Relative error to ComfyUI's samples of ``case`` sampled by the Parallel Sampler node ("node") and by the
    API ("api") on ``layout`` (devices, config; PipeFusion warmup ``warmup``), after ModelSamplingSD3 with the
    inputs ``model_sampling_sd3`` when given."""
    from parallel_runtime.denoise.model_sampling import model_sampling_sd3_node

    devices, config = layout
    handle = load_manual(node_ctx, path, devices, config, warmup)
    model = load_parallel_model(
        LoadRequest(model=path, devices=devices, layout=config, pp_warmup=warmup), pool_registry
    )
    if model_sampling_sd3 is not None:
        handle = ParallelModelSamplingSD3().patch(handle, **model_sampling_sd3)["result"][0]
        model = model.with_model_sampling(model_sampling_sd3_node(**model_sampling_sd3))
    latent = tensor(case["latent"]["samples"])
    settings = tuple(case[k] for k in SETTINGS)
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
        **dict(zip(SETTINGS, settings)),
    )
    expected = tensor(case["expected"]["samples"])
    return {"node": relative_error(result["result"][0]["samples"], expected), "api": relative_error(api, expected)}


def sample_api(model, case: dict, tensor: Callable[[str], torch.Tensor], api_branch: Callable[[list[dict]], tuple]):
    """``case`` sampled through the API on ``model``."""
    latent = tensor(case["latent"]["samples"])
    args = (
        api_branch(case["positive"]),
        api_branch(case["negative"]),
        latent,
        latent.shape[-1] * 8,
        latent.shape[-2] * 8,
    )
    return model.sample(*args, **{k: case[k] for k in SETTINGS})


def lora_stack_errors(
    model, reference: Mapping[str, Any], tensor: Callable[[str], torch.Tensor], api_branch: Callable, lora_dir
) -> tuple[dict[str, float], dict[str, float]]:
    """Per case of a LoRA reference: the relative error to ComfyUI's samples of ``model`` with the case's LoRA
    stack (files ``lora_dir/<stem>.safetensors``), and that of ``model`` without LoRAs (what the LoRAs change)."""
    from parallel_runtime.service.lora import LoraSpec

    errors, moved = {}, {}
    plain = sample_api(model, reference["cases"][0], tensor, api_branch)
    for case in reference["cases"]:
        specs = [LoraSpec.of(lora_dir / f"{stem}.safetensors", strength) for stem, strength in case["loras"]]
        expected = tensor(case["expected"]["samples"])
        errors[case["name"]] = relative_error(sample_api(model.with_loras(*specs), case, tensor, api_branch), expected)
        moved[case["name"]] = relative_error(plain, expected)
    return errors, moved
