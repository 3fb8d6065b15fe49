"""HiDream-I1 LoRA files sample as ComfyUI's LoraLoaderModelOnly + KSampler do on the same HiDream file: ComfyUI's /
ai-toolkit's ``diffusion_model.<name>.lora_A / lora_B`` and kohya's ``lora_unet_*`` (attention projections of both
streams, a routed and a shared expert, the text feed-forward, a caption projection, a modulation, input and output
layers), alone and two stacked with a negative strength, on one rank, Ulysses 2 and PipeFusion 2 (warmup = steps).

Oracle: tests/data/comfy_hidream_lora_reference.json and tests/data/lora/hidream_lora_*.safetensors, written by
tests/data/make_comfy_hidream_lora_reference.py with ComfyUI 0.3.64's own loader, LoRA code and KSampler on
comfy_ref_hidream.safetensors.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hidream.conditioning import HiDreamText
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.lora import LoraSpec

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_hidream_lora_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["model"]
TOLERANCE = 1e-4  # relative L2, as tests/test_ksampler_fidelity.py
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
STEPS = max(case["steps"] for case in REFERENCE["cases"])


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(
        CondEntry(Conditioning(tensor(e["embeds"]), tensor(e["pooled"]), None, HiDreamText(tensor(e["llama3"]))))
        for e in entries
    )


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm().clamp_min(1e-30))


def sample(model, case: dict) -> torch.Tensor:
    latent = tensor(case["latent"]["samples"])
    names = ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")
    settings = {k: case[k] for k in names}
    args = (branch(case["positive"]), branch(case["negative"]), latent, latent.shape[-1] * 8, latent.shape[-2] * 8)
    return model.sample(*args, **settings)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_stacks_sample_as_comfyui(pool_registry, layout):
    devices, config = LAYOUTS[layout]
    model = load_parallel_model(
        LoadRequest(model=str(FILE), devices=devices, layout=config, pp_warmup=STEPS), pool_registry
    )
    errors, moved = {}, {}
    plain = sample(model, REFERENCE["cases"][0])
    for case in REFERENCE["cases"]:
        specs = [LoraSpec.of(DATA / "lora" / f"{stem}.safetensors", strength) for stem, strength in case["loras"]]
        expected = tensor(case["expected"]["samples"])
        errors[case["name"]] = relative_error(sample(model.with_loras(*specs), case), expected)
        moved[case["name"]] = relative_error(plain, expected)  # what the LoRAs change: far above the tolerance
    assert max(errors.values()) <= TOLERANCE, (layout, errors)
    assert min(moved.values()) > 100 * TOLERANCE, moved
