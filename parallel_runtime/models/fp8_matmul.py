"""Whether an fp8 model's layers multiply in fp8 (``torch._scaled_mm``) or upcast their weight per call.

GPUs of compute capability 8.9 and newer (Ada, Hopper, Blackwell) multiply fp8 matrices natively: the layer
then quantises its input per call and never builds the wider weight (``fp8.scaled_mm_linear``), which is
faster than upcasting the weight every call (on an H100, 4608x3072x12288: 0.44 ms against 0.65 ms) at the
price of the input's own fp8 rounding (about 3% relative error per layer's product against 0.3% for the
upcast one). "auto" uses it where the device and the layer allow it; "upcast" keeps the exact-weight path.
Input scales: one per row on sm90+, one per tensor on sm89 (where torch's row-wise fp8 kernels may be absent).
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from .fp8 import fp8_layers

FP8_MATMUL_MODES = ("auto", "upcast", "scaled_mm")
MIN_CAPABILITY = (8, 9)


def check_fp8_matmul(mode: str) -> str:
    if mode not in FP8_MATMUL_MODES:
        raise ConfigError(
            f"fp8_matmul={mode!r}",
            "fp8 layers either upcast their weight per call or multiply in fp8 with torch._scaled_mm",
            f"use one of {', '.join(FP8_MATMUL_MODES)}",
        )
    return mode


def choose_fp8_matmul(
    mode: str,
    device: torch.device,
    compute_dtype: torch.dtype,
    capability: tuple[int, int] | None = None,
) -> tuple[str, str]:
    """("scaled_mm" or "upcast", why) for fp8 layers computing in ``compute_dtype`` on ``device``.
    ``capability``: the CUDA compute capability (read from the device when None)."""
    check_fp8_matmul(mode)
    if mode == "upcast":
        return "upcast", "fp8_matmul=upcast: each layer upcasts its weight per call"
    problem = None
    if not hasattr(torch, "_scaled_mm"):
        problem = f"this torch ({torch.__version__}) has no torch._scaled_mm"
    elif compute_dtype not in (torch.bfloat16, torch.float16):
        problem = f"the model computes in {str(compute_dtype).removeprefix('torch.')} (fp8 products give bf16/fp16)"
    elif device.type != "cuda" and mode == "auto":
        problem = f"no fp8 matrix units on {device.type}"
    elif device.type == "cuda":
        cap = capability or tuple(torch.cuda.get_device_capability(device))
        if cap < MIN_CAPABILITY:
            problem = f"sm{cap[0]}{cap[1]} has no fp8 matrix units (sm89+ has)"
    if problem is not None:
        if mode == "scaled_mm":
            raise ConfigError(
                f"fp8_matmul=scaled_mm on {device}", problem, "use fp8_matmul auto or upcast on this device"
            )
        return "upcast", f"fp8 layers upcast their weight per call: {problem}"
    return "scaled_mm", "fp8 layers multiply in fp8 (torch._scaled_mm, input scaled per call)"


def apply_fp8_matmul(
    model: nn.Module, mode: str, device: torch.device, compute_dtype: torch.dtype, capability=None
) -> str:
    """Set every fp8 layer of ``model`` to the chosen product (layers whose sizes are not multiples of 16,
    or whose weight is e5m2, keep upcasting); returns what was chosen and why (for the loader node)."""
    layers = fp8_layers(model)
    if not layers:
        return "no fp8 layers"
    chosen, why = choose_fp8_matmul(mode, torch.device(device), compute_dtype, capability)
    cap = capability or (torch.cuda.get_device_capability(device) if torch.device(device).type == "cuda" else (0, 0))
    kept = 0
    for layer in layers.values():
        fits = layer.in_features % 16 == 0 and layer.out_features % 16 == 0
        fits = fits and layer.weight.dtype == torch.float8_e4m3fn
        layer.matmul = chosen if fits else "upcast"
        layer.rowwise = tuple(cap) >= (9, 0) or torch.device(device).type != "cuda"
        kept += chosen == "scaled_mm" and not fits
    return why + (f" ({kept} layers of other sizes upcast)" if kept else "")
