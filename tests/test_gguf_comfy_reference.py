"""GGUF files give ComfyUI-GGUF's pictures: the Parallel Model Loader (same .gguf) -> Parallel Sampler against
ComfyUI 0.3.64's ``UnetLoaderGGUF`` (or ``UnetLoaderGGUFAdvanced`` with dequant_dtype float32) ->
``LoraLoaderModelOnly`` -> ``KSampler``, on one rank, Ulysses 2 and PipeFusion 2 (warmup = steps, so exact),
within 1e-4 (relative L2 of the final latent).

Oracle: tests/data/comfy_gguf_reference.json and the tiny files in tests/data/gguf (Flux.1 Q8_0 with F16 rows,
Qwen-Image Q5_1, Wan 2.1 Q4_K with its 5-D patch embedding), written by tests/data/make_comfy_gguf_reference.py
with ComfyUI's and ComfyUI-GGUF's own code. Real CPU worker pools, the real GGUF loading path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

import lora_files as lf
import pytest
import torch

from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.lora import LoraSpec

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import hashed_uniform  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_gguf_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
WIDTHS = {"qwen-image": 24, "wan": 4096}


@functools.cache
def model_file(name: str) -> Path:
    entry = REFERENCE["models"][name]
    path = DATA / entry["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], f"{path} is not the file ComfyUI ran"
    return path


def conditioning(family: str, name: str) -> Conditioning:
    """The reference script's CONDITIONING (hash-valued: rebuilt here, not stored)."""
    tokens = REFERENCE["tokens"]
    if family == "flux":
        cond, pooled = lf.conditioning(f"gguf.{name}", tokens, lf.FLUX_CONFIG["context_in_dim"], 32)
        return Conditioning(cond, pooled)
    return Conditioning(hashed_uniform(f"gguf/{family}/{name}", (1, tokens, WIDTHS[family]), 1.0))


def expected(case: dict) -> torch.Tensor:
    t = case["expected"]
    latent = torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])
    return latent[:, :, 0] if REFERENCE["models"][case["model"]]["family"] == "qwen-image" else latent


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(want.shape)}"
    return float((got - want).norm() / want.norm())


def run(registry, case: dict, layout: str) -> torch.Tensor:
    devices, config = LAYOUTS[layout]
    family = REFERENCE["models"][case["model"]]["family"]
    settings = REFERENCE["sampling"][family]
    request = LoadRequest(
        model=str(model_file(case["model"])), devices=devices, layout=config, pp_warmup=settings["steps"],
        dequant_dtype=case["dequant_dtype"],
    )  # fmt: skip
    model = load_parallel_model(request, registry)
    assert model.family == family
    if case["loras"]:
        model = model.with_loras(*(LoraSpec.of(DATA / "lora" / f"{stem}.safetensors", s) for stem, s in case["loras"]))
    shape = expected(case).shape
    return model.sample(
        conditioning(family, "positive"),
        conditioning(family, "negative"),
        torch.zeros(shape),
        shape[-1] * 8,
        shape[-2] * 8,
        seed=settings["seed"],
        steps=settings["steps"],
        cfg=settings["cfg"],
        sampler_name=settings["sampler_name"],
        scheduler=settings["scheduler"],
        guidance=settings.get("guidance"),
    )


def test_default_arithmetic_is_comfyui_gguf_s_not_exact_float32(pool_registry):
    """The default follows ComfyUI-GGUF's float16 products: nearer to its default picture than the float32
    dequantisation's picture is (one rank: the parallel layouts add no error of their own)."""
    case = REFERENCE["cases"]["flux_default"]
    exact = expected(REFERENCE["cases"]["flux_float32"])
    ours = run(pool_registry, case, "1rank")
    gap = relative_error(exact, expected(case))
    assert gap > 0
    assert relative_error(ours, expected(case)) < 0.1 * gap


# Every layout for the plain cases and one LoRA stack; the other arithmetic / LoRA cases where they differ.
LAYOUTS_OF = {"flux_float32": ("1rank", "ulysses2"), "flux_lora_dora": ("1rank",), "flux_lora_float32": ("1rank",)}


def pool_of(name: str) -> tuple:
    """What a case's pools are keyed by (besides the layout): the file and its dequantisation arithmetic."""
    case = REFERENCE["cases"][name]
    return case["model"], case["dequant_dtype"]


# Cases that share a loaded model run together, layout by layout (the pools hold 3: one model's layouts stay
# warm while its LoRA cases run, instead of every case restarting the pools the case before evicted).
ORDER = {key: i for i, key in enumerate(dict.fromkeys(pool_of(name) for name in REFERENCE["cases"]))}
CASES = [
    pytest.param(name, layout, id=f"{layout}-{name}")
    for name in sorted(REFERENCE["cases"], key=lambda n: ORDER[pool_of(n)])
    for layout in LAYOUTS_OF.get(name, tuple(LAYOUTS))
]


@pytest.mark.parametrize(("name", "layout"), CASES)
def test_parallel_sampler_equals_comfyui_gguf(pool_registry, name, layout):
    case = REFERENCE["cases"][name]
    error = relative_error(run(pool_registry, case, layout), expected(case))
    assert error <= TOLERANCE, f"{name} on {layout}: relative error {error:.2e} against ComfyUI-GGUF"
