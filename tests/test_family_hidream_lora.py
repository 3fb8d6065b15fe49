"""HiDream-I1 LoRA files sample as ComfyUI's LoraLoaderModelOnly + KSampler do on the same HiDream file: ComfyUI's /
ai-toolkit's ``diffusion_model.<name>.lora_A / lora_B`` and kohya's ``lora_unet_*`` (attention projections of both
streams, a routed and a shared expert, the text feed-forward, a caption projection, a modulation, input and output
layers), alone and two stacked with a negative strength, on one rank, Ulysses 2 and PipeFusion 2 (warmup = steps).

Oracle: tests/data/comfy_hidream_lora_reference.json and tests/data/lora/hidream_lora_*.safetensors, written by
tests/data/make_comfy_hidream_lora_reference.py with ComfyUI 0.3.64's own loader, LoRA code and KSampler on
comfy_ref_hidream.safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comfy_ksampler_cases import TOLERANCE, lora_stack_errors, tensor_reader  # tests/ helper

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hidream.conditioning import HiDreamText
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_hidream_lora_reference.json").read_text(encoding="utf-8"))
FILE = DATA / REFERENCE["model"]
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
STEPS = max(case["steps"] for case in REFERENCE["cases"])


tensor = tensor_reader(REFERENCE)


def branch(entries: list[dict]) -> tuple[CondEntry, ...]:
    return tuple(
        CondEntry(Conditioning(tensor(e["embeds"]), tensor(e["pooled"]), None, HiDreamText(tensor(e["llama3"]))))
        for e in entries
    )


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_stacks_sample_as_comfyui(pool_registry, layout):
    devices, config = LAYOUTS[layout]
    model = load_parallel_model(
        LoadRequest(model=str(FILE), devices=devices, layout=config, pp_warmup=STEPS), pool_registry
    )
    errors, moved = lora_stack_errors(model, REFERENCE, tensor, branch, DATA / "lora")
    assert max(errors.values()) <= TOLERANCE, (layout, errors)
    assert min(moved.values()) > 100 * TOLERANCE, moved
