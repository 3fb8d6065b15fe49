"""GGML blocks -> torch values, vectorised over every block at once, on the tensor's own device.

Each packed format (llama.cpp's ``block_q*`` structs) stores per block one or two float16 factors, maybe
per-group scales and minimums packed in 4 or 6 bits, and the quantised integers. A block decodes to

    value = (d x group scale) x q  [- dmin x group min]        (K formats)
    value = d x q  [+ m]                                         (32-element formats)

where the products are formed in the *arithmetic dtype* and rounded after each operation. That dtype is
what ComfyUI-GGUF's ``dequant_dtype`` chooses (:data:`DEQUANT_MODES`): "default" keeps the float16 of the
stored factors (every product a float16 rounding; the result is then cast to the compute dtype),
"target" uses the compute dtype itself, "float32" / "float16" / "bfloat16" that dtype. The order of the
operations is the GGML reference decoder's, so the values equal ComfyUI-GGUF's for every mode. BF16 and
the plain float types are exact casts (the mode does not apply).

A decoder takes the blocks as a ``[n, nbytes]`` uint8 tensor and the arithmetic dtype, and returns
``[n, elements]`` values in that dtype; :func:`dequantise` does the bookkeeping around them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from ...errors import ConfigError
from .formats import QK_K, GGMLType, ggml_type

DEQUANT_MODES: tuple[str, ...] = ("default", "target", "float32", "float16", "bfloat16")
Decoder = Callable[[torch.Tensor, torch.dtype], torch.Tensor]

# The 16 values a 4-bit index selects in the non-linear IQ4 formats (GGML's kvalues_iq4nl).
IQ4_VALUES: tuple[int, ...] = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def arithmetic_dtype(mode: str, target: torch.dtype) -> torch.dtype:
    """The dtype the block factors are multiplied in, for ``mode`` and the compute dtype ``target``."""
    if mode == "default":
        return torch.float16
    if mode == "target":
        return target
    if mode in DEQUANT_MODES:
        return getattr(torch, mode)
    raise ConfigError(
        f"dequant_dtype {mode!r}",
        "GGUF blocks are dequantised in the dtype ComfyUI-GGUF's UnetLoaderGGUFAdvanced offers",
        f"use one of {', '.join(DEQUANT_MODES)}",
    )


# -- unpacking helpers: all take / give [n, ...] integer tensors ---------------------------------------
def _f16(blocks: torch.Tensor, at: int, dtype: torch.dtype) -> torch.Tensor:
    """The float16 stored at byte ``at`` of every block, as [n, 1] in ``dtype``."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).to(dtype)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., k] bytes -> [..., 2, k]: the low nibbles of the k bytes, then their high nibbles."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-2)


def _bit_planes(packed: torch.Tensor, width: int) -> torch.Tensor:
    """[..., k] bytes -> [..., 8 // width, k]: field j holds bits j*width .. j*width + width-1 of each byte."""
    mask = (1 << width) - 1  # shifts by Python ints: no index tensor copied to the device per call
    return torch.stack([(packed >> shift) & mask for shift in range(0, 8, width)], dim=-2)


@functools.lru_cache(maxsize=16)
def _iq4_table(device: torch.device) -> torch.Tensor:
    """The IQ4 values on ``device`` (a constant, made once per device rather than copied there per call)."""
    return torch.tensor(IQ4_VALUES, dtype=torch.int16, device=device)


def _lookup(indices: torch.Tensor) -> torch.Tensor:
    return _iq4_table(indices.device)[indices.long()]


def _grouped(scale: torch.Tensor, q: torch.Tensor, offset: torch.Tensor | None, subtract: bool) -> torch.Tensor:
    """scale [n, g] x q [n, g, k] then -/+ offset [n, g] (each operation rounded in scale's dtype)."""
    out = scale.unsqueeze(-1) * q
    if offset is None:
        return out.flatten(1)
    return (out - offset.unsqueeze(-1) if subtract else out + offset.unsqueeze(-1)).flatten(1)


# -- 32-element formats ----------------------------------------------------------------------------
def _q8_0(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _f16(blocks, 0, dtype) * blocks[:, 2:].view(torch.int8)


def _q4_0(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = _nibbles(blocks[:, 2:]).flatten(1).to(torch.int16) - 8
    return _f16(blocks, 0, dtype) * q


def _q4_1(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = _nibbles(blocks[:, 4:]).flatten(1)
    return _f16(blocks, 0, dtype) * q + _f16(blocks, 2, dtype)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """The 32 high bits (one per value, value j at bit j of a little-endian uint32) as [n, 32] of 0 / 16."""
    return _bit_planes(qh, 1).transpose(-1, -2).flatten(1) << 4


def _q5_0(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = (_nibbles(blocks[:, 6:]).flatten(1) | _fifth_bits(blocks[:, 2:6])).to(torch.int16) - 16
    return _f16(blocks, 0, dtype) * q


def _q5_1(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    q = _nibbles(blocks[:, 8:]).flatten(1) | _fifth_bits(blocks[:, 4:8])
    return _f16(blocks, 0, dtype) * q + _f16(blocks, 2, dtype)


def _iq4_nl(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _f16(blocks, 0, dtype) * _lookup(_nibbles(blocks[:, 2:]).flatten(1))


# -- 256-element (K) formats -----------------------------------------------------------------------
def _six_bit_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 8 scales and 8 minimums of 6 bits in 12 bytes (GGML's get_scale_min_k4), each [n, 8]."""
    first, second, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat((first & 0x3F, (rest & 0x0F) | ((first >> 6) << 4)), dim=1)
    mins = torch.cat((second & 0x3F, (rest >> 4) | ((second >> 6) << 4)), dim=1)
    return scales, mins


def _two_bit_quants(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K / Q3_K low bits: 64 bytes -> [n, 16 groups, 16] of 2-bit values. Value (half h, shift s, sub u,
    lane l) is bits 2s of byte h*32 + u*16 + l; its group is h*8 + s*2 + u."""
    return _bit_planes(qs.reshape(qs.shape[0], 2, 32), 2).reshape(qs.shape[0], 16, 16)


def _q2_k(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    packed = blocks[:, 0:16]
    scales, mins = packed & 0x0F, packed >> 4
    d, dmin = _f16(blocks, 80, dtype), _f16(blocks, 82, dtype)
    return _grouped(d * scales, _two_bit_quants(blocks[:, 16:80]), dmin * mins, subtract=True)


def _q3_k(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n = blocks.shape[0]
    hmask, packed = blocks[:, 0:32], blocks[:, 96:108]
    low4 = _nibbles(packed[:, 0:8]).flatten(1)  # scale i: nibble i // 8 of byte i % 8
    high2 = _bit_planes(packed[:, 8:12], 2).flatten(1)  # scale i: bits 2 * (i // 4) of byte 8 + i % 4
    scales = (low4 | (high2 << 4)).to(torch.int16) - 32
    # the high bit of value (h, s, u, l) is bit h*4 + s of hmask byte u*16 + l; set means "no -4"
    high = _bit_planes(hmask, 1).reshape(n, 16, 16)  # [n, bit (h, s), byte (u, l)]: already group-major
    q = _two_bit_quants(blocks[:, 32:96]).to(torch.int16) - 4 * (1 - high.to(torch.int16))
    return _grouped(_f16(blocks, 108, dtype) * scales, q, None, subtract=False)


def _q4_k(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n = blocks.shape[0]
    scales, mins = _six_bit_scales(blocks[:, 4:16])
    q = _nibbles(blocks[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    d, dmin = _f16(blocks, 0, dtype), _f16(blocks, 2, dtype)
    return _grouped(d * scales, q, dmin * mins, subtract=True)


def _q5_k(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n = blocks.shape[0]
    scales, mins = _six_bit_scales(blocks[:, 4:16])
    low = _nibbles(blocks[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    high = _bit_planes(blocks[:, 16:48], 1)  # [n, 8 groups, 32]: bit g of byte l
    d, dmin = _f16(blocks, 0, dtype), _f16(blocks, 2, dtype)
    return _grouped(d * scales, low | (high << 4), dmin * mins, subtract=True)


def _q6_k(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n = blocks.shape[0]
    # value (half h, quarter k, lane l): low nibble k // 2 of ql byte h*64 + (k % 2)*32 + l, high bits 2k of
    # qh byte h*32 + l; group (h*128 + k*32 + l) // 16
    low = _nibbles(blocks[:, 0:128].reshape(n, 2, 64)).reshape(n, 2, 4, 32)
    high = _bit_planes(blocks[:, 128:192].reshape(n, 2, 32), 2)
    q = ((low | (high << 4)).to(torch.int16) - 32).reshape(n, 16, 16)
    scales = blocks[:, 192:208].view(torch.int8)
    return _grouped(_f16(blocks, 208, dtype) * scales, q, None, subtract=False)


def _iq4_xs(blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n = blocks.shape[0]
    low4 = _nibbles(blocks[:, 4:8]).transpose(-1, -2).flatten(1)  # group g: nibble g % 2 of byte g // 2
    high2 = _bit_planes(blocks[:, 2:4], 2).transpose(-1, -2).flatten(1)  # group g: bits 2 * (g % 4) of byte g // 4
    scales = (low4 | (high2 << 4)).to(torch.int16) - 32
    q = _lookup(_nibbles(blocks[:, 8:136].reshape(n, 8, 16)).reshape(n, 8, 32))
    return _grouped(_f16(blocks, 0, dtype) * scales, q, None, subtract=False)


DECODERS: Mapping[str, Decoder] = MappingProxyType(
    {
        "Q8_0": _q8_0,
        "Q5_0": _q5_0,
        "Q5_1": _q5_1,
        "Q4_0": _q4_0,
        "Q4_1": _q4_1,
        "Q2_K": _q2_k,
        "Q3_K": _q3_k,
        "Q4_K": _q4_k,
        "Q5_K": _q5_k,
        "Q6_K": _q6_k,
        "IQ4_NL": _iq4_nl,
        "IQ4_XS": _iq4_xs,
    }
)
assert QK_K == 256  # the K decoders above are written for 256-value super-blocks


def dequantise(
    data: torch.Tensor,
    kind: GGMLType | int,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    mode: str = "default",
) -> torch.Tensor:
    """The tensor of ``shape`` stored as ``kind`` in the bytes ``data`` (uint8, any shape; or the float tensor
    of a plain type), as ``dtype`` on ``data``'s device. ``mode``: see :data:`DEQUANT_MODES`."""
    kind = kind if isinstance(kind, GGMLType) else ggml_type(kind)
    if not kind.packed:
        stored = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[kind.name]
        values = data if data.dtype == stored else data.reshape(-1).view(torch.uint8).view(stored)
        return values.reshape(shape).to(dtype)
    blocks = data.reshape(-1).view(torch.uint8).reshape(-1, kind.nbytes)
    values = DECODERS[kind.name](blocks, arithmetic_dtype(mode, dtype))
    return values.reshape(shape).to(dtype)
