"""Storing a patched fp32 weight back in fp8: stochastic rounding, seeded per tensor.

A LoRA delta is often smaller than the spacing of fp8 values, so rounding to nearest would drop it
entirely. Like ComfyUI (which stores patched fp8 weights with stochastic rounding seeded by the tensor's
name), each value is rounded to one of its two fp8 neighbours at random, with the probability of each
given by the distance to it: unbiased on average. The generator is seeded per tensor, so the same
patch always gives the same bits (strength a -> b -> a is exact).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch

MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """``x`` (float) rounded up or down to the fp8 ``dtype`` at random, unbiased, from generator ``seed``."""
    info = torch.finfo(dtype)
    value = x.to(torch.float32)
    magnitude = value.abs().clamp(max=info.max)
    # the binade of each value; subnormals share the spacing of the smallest normal binade
    exponent = torch.floor(torch.log2(magnitude.clamp(min=info.smallest_normal)))
    spacing = torch.exp2(exponent - MANTISSA_BITS[dtype])
    generator = torch.Generator(device=value.device).manual_seed(seed)
    noise = torch.rand(value.shape, generator=generator, device=value.device, dtype=torch.float32)
    rounded = (torch.floor(magnitude / spacing + noise) * spacing).clamp(max=info.max)
    return (rounded * torch.sign(value)).to(dtype)


def rounding_for(name: str) -> Callable[[torch.Tensor, torch.dtype], torch.Tensor]:
    """The ``round_fn(x, fp8_dtype)`` for the tensor ``name`` (its seed is the CRC-32 of the name)."""
    seed = zlib.crc32(name.encode())
    return lambda x, dtype: stochastic_round(x, dtype, seed)
