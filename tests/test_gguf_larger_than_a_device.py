"""A Q4 GGUF model larger than any one device runs split across devices (issue 29's "done when"), shown on CPU:
two CPU ranks stated (``$DIT_PARALLEL_CPU_MEMORY``) to have less memory than the tiny Wan Q4_K file needs whole,
but more than its larger PipeFusion half; the auto layout (GGML bytes counted) chooses pp=2, each rank holds only
its stage's blocks, and the picture equals the same file's single-device one (warmup = steps: no stale K/V) and
ComfyUI-GGUF's. The peak host RAM of a rank loading its share is measured in tests/test_gguf_nodes.py."""

from __future__ import annotations

import pytest
import torch
from test_gguf_comfy_reference import REFERENCE, conditioning, expected, model_file, relative_error

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.model_info import model_info_from_path
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.layout import LayoutRequest, activation_bytes, plan_layout
from parallel_runtime.parallel.machine import CPU_MEMORY_ENV, MachineInfo
from parallel_runtime.service.api import LoadRequest, load_parallel_model

CASE = REFERENCE["cases"]["wan_default"]
SETTINGS = REFERENCE["sampling"]["wan"]
WAN = model_file(CASE["model"])


def _request() -> LayoutRequest:
    """The generation's size as the planner sees it (ComfyUI's latent [1, 16, 2, 6, 8]: 5 frames of 48x64)."""
    frames, rows, cols = CASE["latent_shape"][2:]
    return LayoutRequest(
        width=cols * 8, height=rows * 8, frames=4 * frames - 3, cfg=SETTINGS["cfg"], reserve_bytes=0, text_tokens=6
    )


def _sample(model) -> torch.Tensor:
    shape = CASE["latent_shape"]
    return model.sample(
        conditioning("wan", "positive"), conditioning("wan", "negative"), torch.zeros(shape), shape[-1] * 8,
        shape[-2] * 8, seed=SETTINGS["seed"], steps=SETTINGS["steps"], cfg=SETTINGS["cfg"],
        sampler_name=SETTINGS["sampler_name"], scheduler=SETTINGS["scheduler"],
    )  # fmt: skip


def test_cpu_memory_is_stated_per_rank_or_refused(monkeypatch):
    monkeypatch.setenv(CPU_MEMORY_ENV, "96MiB")
    machine = MachineInfo.detect("cpu:2")
    assert [d.free_bytes for d in machine.devices] == [96 * 1024**2] * 2
    monkeypatch.setenv(CPU_MEMORY_ENV, "1.5GB")
    assert MachineInfo.detect("cpu:1").devices[0].total_bytes == 1_500_000_000
    for bad in ("lots", "0", "12 parsecs"):
        monkeypatch.setenv(CPU_MEMORY_ENV, bad)
        with pytest.raises(ConfigError, match=f"{CPU_MEMORY_ENV}='{bad}'"):
            MachineInfo.detect("cpu:2")
    monkeypatch.setenv(CPU_MEMORY_ENV, "64KiB")  # too little even split: the sizes as they are, and the setting named
    info = model_info_from_path(WAN, dtype="fp32")
    with pytest.raises(
        ConfigError, match=r"needs about 2\.3 MiB of weights but the 2 device\(s\) have 128\.0 KiB"
    ) as err:
        plan_layout(MachineInfo.detect("cpu:2"), info, _request())
    assert f"raise ${CPU_MEMORY_ENV}" in str(err.value) and "64.0 KiB of 64.0 KiB free" in str(err.value)


def test_a_q4_model_larger_than_each_rank_is_split_and_equals_one_device(pool_registry, monkeypatch):
    info = model_info_from_path(WAN, dtype="fp32")
    assert "GGUF Q4_K" in info.storage_note
    request = _request()
    stages = info.stage_bytes(info.stage_counts(2))
    # Each rank: its larger half's weights and a PipeFusion rank's activations (both branches, all tokens); left
    # for weights beside them, less than the whole model (and less than it needs beside the smaller activations
    # of an unsplit layout: one branch on all tokens under CFG parallel, both on half of them under Ulysses).
    split_act = activation_bytes(info, request, 1, 2)
    memory = max(stages) + split_act + 1024
    assert memory - split_act < info.weight_bytes and memory - activation_bytes(info, request, 1, 1) < info.weight_bytes
    assert activation_bytes(info, request, 2, 2) == activation_bytes(info, request, 1, 1)
    monkeypatch.setenv(CPU_MEMORY_ENV, str(memory))
    plan = plan_layout(MachineInfo.detect("cpu:2"), info, request)
    assert plan.config == ParallelConfig(pp=2), plan.reason
    assert "does not fit one device" in plan.reason and "GGUF Q4_K" in plan.reason and "no CFG parallel" in plan.reason
    monkeypatch.setenv(CPU_MEMORY_ENV, str(10 * memory))  # the control: room for the whole model, no split
    assert plan_layout(MachineInfo.detect("cpu:2"), info, request).config.pp == 1

    steps = SETTINGS["steps"]
    split = load_parallel_model(
        LoadRequest(model=str(WAN), devices="cpu:2", layout=plan.config, pp_warmup=steps,
                    pp_stage_weights=plan.pp_stage_weights),
        pool_registry,
    )  # fmt: skip
    held = [r["param_bytes"] for r in split.info["pipefusion"]["ranks"]]
    assert held == list(plan.stage_weight_bytes), held  # 1.8 MiB and 489 KiB of the file's 2.3 MiB
    assert max(held) <= memory - split_act < info.weight_bytes and sum(held) == info.weight_bytes
    got = _sample(split)
    single = _sample(load_parallel_model(LoadRequest(model=str(WAN), devices="cpu:1"), pool_registry))
    assert torch.equal(got, single), relative_error(got, single)  # no stale K/V: PipeFusion adds no error
    assert relative_error(got, expected(CASE)) <= 1e-4
