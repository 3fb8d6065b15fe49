"""Read and check a .safetensors header before any weight is loaded (on the host, in milliseconds).

A truncated download or a damaged file otherwise fails late, on the workers, with a raw
``JSONDecodeError`` or ``SafetensorError``. The checks follow the format: an 8-byte little-endian
header length, a JSON object mapping tensor names to ``dtype``, ``shape`` and ``data_offsets``
(relative to the end of the header), the tensor bytes after it. Every tensor must lie inside the
file, take exactly ``prod(shape) x itemsize`` bytes and not overlap another.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from ..errors import ConfigError

MAX_HEADER_BYTES = 100 * 1024**2
ITEM_BITS: Mapping[str, int] = MappingProxyType(
    {
        "BOOL": 8,
        "U8": 8,
        "I8": 8,
        "F8_E4M3": 8,
        "F8_E5M2": 8,
        "F8_E8M0": 8,
        "I16": 16,
        "U16": 16,
        "F16": 16,
        "BF16": 16,
        "I32": 32,
        "U32": 32,
        "F32": 32,
        "I64": 64,
        "U64": 64,
        "F64": 64,
        "C64": 64,
    }
)
"""Bits per element of the safetensors dtypes; others (newer sub-byte formats) get offset checks only."""


def _damaged(file: Path, what: str) -> ConfigError:
    return ConfigError(
        f"{file.name}: {what}",
        "the file is truncated or damaged (an interrupted download or copy), or it is not a .safetensors file",
        "download or copy the file again (its size should match the published one)",
    )


def read_header(file: str | os.PathLike) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", "data_offsets"} of ``file`` (``__metadata__`` removed),
    after checking the whole header against the file's size. ConfigError (what/why/fix) otherwise."""
    return read_checked(file)[0]


def read_checked(file: str | os.PathLike, data: bool = True) -> tuple[dict[str, dict], dict[str, str]]:
    """(tensors, ``__metadata__``) of ``file``'s header, checked as :func:`read_header` says. With
    ``data=False`` the tensors' bytes are not required to be there (header-only stand-ins of published
    files, read for their shapes): the header itself is still checked."""
    path = Path(file)
    total = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise _damaged(path, f"only {total} byte(s) long; a .safetensors file starts with an 8-byte header size")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER_BYTES:
            raise _damaged(path, f"implausible header size {size} bytes (more than {MAX_HEADER_BYTES >> 20} MiB)")
        if 8 + size > total:
            raise _damaged(path, f"the header says it is {size} bytes but the file has only {total - 8} after it")
        text = f.read(size)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(path, f"the header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _damaged(path, "the header is not a JSON object of tensors")
    metadata = header.pop("__metadata__", None) or {}
    check_entries(path, header, total - 8 - size if data else None)
    return header, metadata


def check_entries(path: Path, header: Mapping[str, object], data_bytes: int | None) -> None:
    """Every entry well-formed, inside the ``data_bytes`` after the header, sized by its shape and
    dtype, and not overlapping another (``data_bytes`` None: well-formed only)."""
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise _damaged(path, f"tensor {name!r} has no description")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or not _int_list(shape) or not _int_list(offsets) or len(offsets) != 2:
            raise _damaged(path, f"tensor {name!r} has a malformed entry {entry!r}")
        begin, end = offsets
        if min(shape, default=0) < 0 or not 0 <= begin <= end:
            raise _damaged(path, f"tensor {name!r} has a negative size or offset ({shape}, {offsets})")
        if data_bytes is None:
            continue
        if end > data_bytes:
            raise _damaged(
                path, f"tensor {name!r} ends at byte {end} of the data but the file holds only {data_bytes} bytes"
            )
        bits = ITEM_BITS.get(dtype)
        if bits is not None and (end - begin) * 8 != math.prod(shape) * bits:
            raise _damaged(
                path,
                f"tensor {name!r} ({dtype} {list(shape)}) needs {math.prod(shape) * bits // 8} bytes "
                f"but its offsets span {end - begin}",
            )
        spans.append((begin, end, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise _damaged(path, f"tensors {first!r} and {second!r} overlap")


def _int_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
