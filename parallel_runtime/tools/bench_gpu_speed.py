"""``python -m parallel_runtime bench gpu-speed``: what the fast paths buy on one GPU, on the real-size Flux.1.

The Flux.1 [dev] 12B layout of ``bench gpu`` (random bf16 weights, 1024x1024: 4096 image + 512 text tokens,
one evaluation = one sampler step without CFG), for every attention kernel the GPU can run (sdpa, flash,
flash3, sage, cudnn) x compiled blocks off / on x bf16 / fp8 weights (the block Linears stored in fp8 with a
per-tensor scale, multiplied as ``fp8_matmul=auto`` chooses), each measured:

- ``step_seconds``: the engine's step (median of interleaved repeats);
- ``reused_step_seconds``: a step the block cache answers from its cached residual (first block computed,
  the rest reused): the cost of a reused step; a cache that reuses a fraction f of the steps makes a
  sampling ``1 / ((1 - f) + f * reused / step)`` times faster;
- ``compile_seconds``: the first compiled call (compiling the block kinds);
- ``error_vs_eager_sdpa``: the step's relative L2 distance from the eager bf16 SDPA step (kernels and fp8
  products are not exact: SageAttention quantises Q.K^T, fp8 products round their input).

Variants run in a fixed priority order within ``budget_s`` seconds; those left are listed as not measured.
Without CUDA a small float32 config runs on the CPU (SDPA only, no compile in ``--quick``) and says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..attention.kernels import describe_choice, usable_backends
from ..denoise.caching.cached_denoiser import CachedDenoiser
from ..denoise.caching.specs import BlockCacheSpec
from ..denoise.denoiser import Denoiser
from ..denoise.model_sampling import model_sampling_for
from ..models.base import COMPUTE_DTYPE_ATTR
from ..models.compiled_blocks import set_compiled_blocks
from ..models.families.flux.adapter import FluxAdapter
from ..models.fp8 import Fp8Linear, quantise_per_tensor, set_scale
from ..models.fp8_matmul import apply_fp8_matmul
from ..parallel.mesh import ParallelMesh
from .bench_gpu import Inputs, _model_words, _setup, _timed, random_flux
from .measure import interleave
from .report import machine

KERNEL_ORDER = ("sdpa", "flash3", "flash", "sage", "cudnn")
DEFAULT_BUDGET_S = 240.0
REUSING = BlockCacheSpec(threshold=10.0, first_blocks=1, max_consecutive=10_000, warmup_steps=1)


def store_blocks_in_fp8(adapter: FluxAdapter) -> int:
    """Replace every Linear of the transformer blocks by an fp8 one (per-tensor scale), in place; returns how many."""
    count = 0
    for i in range(adapter.num_blocks):
        _, block = adapter.block(i)
        for name, module in list(block.named_modules()):
            if type(module) is not nn.Linear:
                continue
            layer = Fp8Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
            values, scale = quantise_per_tensor(module.weight.detach())
            layer.weight = nn.Parameter(values, requires_grad=False)
            if module.bias is not None:
                layer.bias = nn.Parameter(module.bias.detach(), requires_grad=False)
            set_scale(layer, scale, module.weight.device)
            parent, _, child = name.rpartition(".")
            setattr(block.get_submodule(parent) if parent else block, child, layer)
            count += 1
    return count


class Variant:
    """One (kernel, compile, weights) combination: its step, its reused step, and its output."""

    def __init__(self, adapter: FluxAdapter, inputs: Inputs, device: torch.device, backend: str):
        self.adapter, self.inputs, self.device, self.backend = adapter, inputs, device, backend
        ms = model_sampling_for(adapter)
        mesh = ParallelMesh.single(device)
        args = (adapter, mesh, ms, inputs.cond, None, 1.0, inputs.guidance, backend)
        self.plain = Denoiser(*args)
        self.cached = CachedDenoiser(*args, block_cache=REUSING)

    def output(self) -> torch.Tensor:
        return self.plain(self.inputs.x, self.inputs.sigma)

    def step(self) -> Callable[[], float]:
        return _timed(self.device, lambda: self.plain(self.inputs.x, self.inputs.sigma))

    def reused_step(self) -> Callable[[], float]:
        self.cached(self.inputs.x, self.inputs.sigma)  # the computed call the cache reuses from
        return _timed(self.device, lambda: self.cached(self.inputs.x, self.inputs.sigma))


def _measure(
    adapter: FluxAdapter, inputs: Inputs, device: torch.device, backend: str, compiled: bool, repeats: int
) -> dict[str, Any]:
    set_compiled_blocks(adapter, "blocks" if compiled else "off")
    variant = Variant(adapter, inputs, device, backend)
    out: dict[str, Any] = {}
    with torch.no_grad():
        if compiled:
            t0 = time.perf_counter()
            variant.output()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            out["compile_seconds"] = time.perf_counter() - t0
        result = variant.output().float()
        times = interleave({"step": variant.step(), "reused": variant.reused_step()}, repeats=repeats, warmup=1)
    out["step_seconds"] = times["step"].summary()
    out["reused_step_seconds"] = times["reused"].summary()
    out["reused_over_step"] = times["reused"].median / times["step"].median
    out["_output"] = result
    return out


def run(quick: bool = False, budget_s: float | None = None) -> dict[str, Any]:
    """The matrix within ``budget_s`` seconds (default: $DIT_GPU_SPEED_BUDGET_S, else DEFAULT_BUDGET_S)."""
    if budget_s is None:
        budget_s = float(os.environ.get("DIT_GPU_SPEED_BUDGET_S", DEFAULT_BUDGET_S))
    s = _setup(quick)
    if s.fallback:
        torch.set_num_threads(1)
    start = time.perf_counter()
    model = random_flux(s.config, s.device, s.dtype)
    adapter = FluxAdapter(model)
    inputs = Inputs(s, adapter)
    kernels = [k for k in KERNEL_ORDER if k in usable_backends(s.device)]
    compile_options = (False,) if (s.fallback and quick) else (False, True)
    res: dict[str, Any] = {
        "model": _model_words(s),
        "baseline": "the engine's eager step with bf16 weights and torch SDPA on the same GPU (one sampler step "
        "without CFG); reused steps: the same step answered by the block cache",
        "device": (torch.cuda.get_device_name(0) if not s.fallback else "cpu (fallback: no CUDA device)"),
        "fallback": s.fallback,
        "machine": machine(),
        "kernels": {k: describe_choice(k, s.device) for k in kernels},
        "auto_kernel": describe_choice("auto", s.device),
        "budget_seconds": budget_s,
        "variants": {},
        "not_measured": [],
    }
    reference: torch.Tensor | None = None
    wide = "bf16" if s.dtype == torch.bfloat16 else "fp32"
    for weights in (wide, "fp8"):
        if weights == "fp8":
            res["fp8_layers"] = store_blocks_in_fp8(adapter)
            setattr(adapter.transformer, COMPUTE_DTYPE_ATTR, s.dtype)  # what the loader records for fp8 files
            res["fp8_matmul"] = apply_fp8_matmul(adapter.transformer, "auto", s.device, s.dtype)
            torch.cuda.empty_cache() if s.device.type == "cuda" else None
        for compiled in compile_options:
            for kernel in kernels:
                name = f"{kernel} {'compiled' if compiled else 'eager'} {weights}"
                if time.perf_counter() - start > budget_s:
                    res["not_measured"].append(name)
                    continue
                try:
                    figures = _measure(adapter, inputs, s.device, kernel, compiled, s.repeats)
                except Exception as exc:  # noqa: BLE001 - one kernel failing is a result, not the end
                    res["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                    continue
                output = figures.pop("_output")
                reference = output if reference is None else reference
                figures["error_vs_eager_sdpa"] = float((output - reference).norm() / reference.norm())
                res["variants"][name] = figures
    set_compiled_blocks(adapter, "off")
    base = res["variants"].get(f"sdpa eager {wide}", {}).get("step_seconds", {}).get("median")
    if base:
        res[f"speedup_vs_sdpa_eager_{wide}"] = {
            name: base / v["step_seconds"]["median"] for name, v in res["variants"].items() if "step_seconds" in v
        }
    res["seconds"] = time.perf_counter() - start
    return res
