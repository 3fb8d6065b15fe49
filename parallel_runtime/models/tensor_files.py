"""Read named tensors (or row ranges of them) from a .safetensors file straight into fresh memory.

The file is read with plain positioned reads, not memory-mapped: pages of a mapping would count in
the process's resident memory next to the copy the model keeps, while read(2) goes through the page
cache only. So a rank that loads its share of a file holds that share and nothing else; the largest
transient is one tensor (for a device target: one tensor in host memory, then copied).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from ..errors import ConfigError

DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F8_E4M3": torch.float8_e4m3fn,
        "F8_E5M2": torch.float8_e5m2,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
    }
)
MAX_HEADER = 100 * 1024**2
READ_CHUNK = 64 * 1024**2  # bytes per read(2) call


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in the file."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows if self.rows else 0


class SafetensorsFile:
    """A .safetensors file: its header, and reads of whole tensors or of row ranges [r0, r1) of dim 0."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        raw_header, self.metadata = read_header(self.path)
        self.header: Mapping[str, Mapping[str, Any]] = MappingProxyType(raw_header)
        with open(self.path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
        base = 8 + size
        entries = {}
        for name, info in raw_header.items():
            dtype = DTYPES.get(info["dtype"])
            if dtype is None:
                raise ConfigError(
                    f"{self.path.name}: tensor {name} has dtype {info['dtype']}",
                    f"tensors are read as one of {', '.join(DTYPES)}",
                    "use a standard .safetensors release of the model",
                )
            start, end = info["data_offsets"]
            entries[name] = TensorEntry(dtype, tuple(info["shape"]), base + start, end - start)
        self.entries: Mapping[str, TensorEntry] = MappingProxyType(entries)
        self._fd: int | None = None
        self._depth = 0  # nested ``with`` blocks share one open descriptor

    def __enter__(self) -> SafetensorsFile:
        if self._depth == 0:
            self._fd = os.open(self.path, os.O_RDONLY)
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def keys(self) -> list[str]:
        return list(self.entries)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: e.shape for k, e in self.entries.items()}

    def read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Tensor ``name`` (rows ``r0:r1`` of dim 0 when given) in the file's dtype, in memory of its own."""
        entry = self._entry(name)
        r0, r1 = (0, entry.rows) if rows is None else rows
        if not 0 <= r0 <= r1 <= entry.rows:
            raise IndexError(f"rows {r0}:{r1} of {name} with {entry.rows} rows")
        out = torch.empty((r1 - r0) * entry.row_bytes, dtype=torch.uint8)
        self._pread_into(out, entry.start + r0 * entry.row_bytes)
        shape = entry.shape if rows is None else (r1 - r0, *entry.shape[1:])
        return out.view(entry.dtype).reshape(shape)

    def read_rows(self, pieces: Sequence[tuple[str, int, int]]) -> torch.Tensor:
        """Row ranges of (possibly several) tensors, concatenated along dim 0."""
        parts = [self.read(name, (r0, r1)) for name, r0, r1 in pieces]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _entry(self, name: str) -> TensorEntry:
        try:
            return self.entries[name]
        except KeyError:
            raise ConfigError(
                f"{self.path.name} has no tensor {name!r}",
                "the loader asked for a tensor the model needs",
                "use the complete model file (a partial or different file cannot load)",
            ) from None

    def _pread_into(self, out: torch.Tensor, offset: int) -> None:
        fd = self._fd if self._fd is not None else os.open(self.path, os.O_RDONLY)
        try:
            pread_exactly(fd, out, offset, self.path)
        finally:
            if self._fd is None:
                os.close(fd)


def pread_exactly(fd: int, out: torch.Tensor, offset: int, path: Path) -> None:
    """Fill the uint8 CPU tensor ``out`` with the bytes of open file ``fd`` from ``offset`` (positioned reads,
    no mapping); a ConfigError naming ``path`` when the file ends first."""
    view = memoryview(out.numpy()).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done : done + READ_CHUNK]], offset + done)
        if n <= 0:
            raise ConfigError(
                f"{path.name} ended early ({offset + done} bytes)",
                "the header promises more data than the file holds",
                "the download is incomplete: fetch the file again",
            )
        done += n


def read_header(path: str | os.PathLike) -> tuple[dict[str, dict], dict[str, str]]:
    """(tensor name -> {"dtype", "shape", "data_offsets"}, metadata) of a .safetensors file (a damaged
    header is a ConfigError; the tensors' bytes are checked by ``safetensors_header.read_header``, which
    the host runs before a load: header-only stand-ins are read here for their shapes)."""
    from .safetensors_header import read_checked

    return read_checked(path, data=False)


def write_tensors(path: str | os.PathLike, shapes: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], make) -> Path:
    """Write a .safetensors file tensor by tensor: ``shapes`` names each tensor's dtype and shape (the
    header), ``make(name)`` returns its data when its turn comes, so only one tensor is in memory at a time."""
    names = {dtype: name for name, dtype in DTYPES.items()}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in shapes.items():
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        header[name] = {"dtype": names[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
    path = Path(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, (dtype, shape) in shapes.items():
            tensor = make(name).to(dtype).contiguous().reshape(shape)
            f.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return path
