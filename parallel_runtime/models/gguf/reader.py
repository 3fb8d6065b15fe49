"""A GGUF file's table of contents, and reads of its tensors (or of row ranges of them) into fresh memory.

The header (metadata and the tensor table) is parsed by the ``gguf`` package's memory-mapped reader,
which touches only the header's pages. The table is copied into a :class:`GGUFFile` and the mapping is
dropped; tensor bytes are then read with positioned reads (``os.preadv``), like
:class:`~parallel_runtime.models.tensor_files.SafetensorsFile`: pages of a mapping would count in the
process's resident memory next to the copy the model keeps, read(2) goes through the page cache only. A
PipeFusion rank therefore holds its share of the file and nothing more.

Shapes are torch's (the reverse of GGML's ``ne``), or ComfyUI-GGUF's ``comfy.gguf.orig_shape.<name>``
when a converter stored a reshaped tensor. A tensor's values lie in row-major order, its blocks along the
innermost dimension; rows ``r0:r1`` of dimension 0 are one byte range when a row holds whole blocks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from ...errors import ConfigError
from ..tensor_files import pread_exactly
from .formats import SUPPORTED, GGMLType, ggml_type

ORIG_SHAPE_PREFIX = "comfy.gguf.orig_shape."
MAX_LISTED = 4096  # metadata arrays longer than this (tokenizer vocabularies) are not copied out
FLOAT_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
)


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: its storage type, torch shape and where its bytes lie."""

    name: str
    kind: GGMLType
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_elements(self) -> int:
        return math.prod(self.shape[1:]) if self.shape else 1

    def row_aligned(self) -> bool:
        """Whether every row of dimension 0 starts at a block boundary (rows can be read on their own)."""
        return self.row_elements % self.kind.elements == 0


def _missing_gguf() -> ConfigError:
    return ConfigError(
        "reading a .gguf file needs the 'gguf' package, which is not installed",
        "GGUF files (ComfyUI-GGUF's format) are parsed with llama.cpp's gguf package",
        "pip install 'gguf>=0.13' into ComfyUI's Python (dit-parallel's requirements.txt lists it)",
    )


def _damaged(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"{path.name}: {what}",
        "the file is truncated or damaged (an interrupted download or copy), or it is not a GGUF file",
        "download or copy the file again (its size should match the published one)",
    )


def _field_value(field: Any) -> Any:
    """A metadata field as a Python value (str, int, float, bool or a list of them); None for long arrays."""
    import gguf

    kinds = list(field.types)
    if not kinds:
        return None
    if kinds[0] == gguf.GGUFValueType.ARRAY:
        if len(field.data) > MAX_LISTED:
            return None
        if kinds[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if kinds[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[-1]]).decode("utf-8", "replace")
    return field.parts[field.data[-1]].tolist()[0]


def _type_name(type_id: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def _check_types(path: Path, architecture: Any, type_ids: list[int]) -> None:
    """Every tensor's type is one ComfyUI-GGUF reads; else a ConfigError naming the types found."""
    counts: dict[int, int] = {}
    for t in type_ids:
        counts[t] = counts.get(t, 0) + 1
    unknown = [t for t in counts if t not in SUPPORTED]
    if unknown:
        found = ", ".join(f"{_type_name(t)} x{n}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        raise ConfigError(
            f"{path.name} (general.architecture {architecture!r}) stores tensors as "
            f"{', '.join(_type_name(t) for t in unknown)} (types found: {found})",
            f"GGUF weights are read in the types ComfyUI-GGUF reads: {', '.join(t.name for t in SUPPORTED.values())}",
            "use a GGUF file quantised to one of these types (e.g. Q8_0, Q5_K_M, Q4_K_M)",
        )


class GGUFFile:
    """A .gguf file: ``metadata`` (key -> value), ``tensors`` (name -> :class:`GGUFTensor`) and reads."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ConfigError(
                f"{self.path} does not exist" if not self.path.exists() else f"{self.path} is not a file",
                "a GGUF model is one .gguf file",
                "pick a .gguf file under ComfyUI/models/unet or models/diffusion_models",
            )
        try:
            import gguf
        except ImportError:
            raise _missing_gguf() from None
        size = self.path.stat().st_size
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                reader = gguf.GGUFReader(self.path)
        except (ValueError, IndexError, KeyError, OverflowError, TypeError) as exc:
            raise _damaged(self.path, f"the GGUF header cannot be read ({exc})") from None
        metadata = {name: _field_value(field) for name, field in reader.fields.items()}
        _check_types(self.path, metadata.get("general.architecture"), [int(t.tensor_type) for t in reader.tensors])
        orig = {k[len(ORIG_SHAPE_PREFIX) :]: v for k, v in metadata.items() if k.startswith(ORIG_SHAPE_PREFIX)}
        tensors = {}
        for t in reader.tensors:
            kind = ggml_type(int(t.tensor_type), t.name, self.path.name)
            stored = tuple(int(d) for d in reversed(t.shape.tolist()))
            shape = tuple(int(d) for d in orig[t.name]) if t.name in orig else stored
            if math.prod(shape) != math.prod(stored):
                raise _damaged(self.path, f"{t.name}'s original shape {shape} does not hold its {stored} values")
            nbytes = kind.tensor_bytes(stored)
            if t.data_offset + nbytes > size:
                raise _damaged(self.path, f"tensor {t.name} ends at byte {t.data_offset + nbytes} of {size}")
            tensors[t.name] = GGUFTensor(t.name, kind, shape, int(t.data_offset), nbytes)
        del reader  # drops the mapping: nothing of the file stays mapped
        self.metadata: Mapping[str, Any] = MappingProxyType(metadata)
        self.tensors: Mapping[str, GGUFTensor] = MappingProxyType(tensors)
        self._fd: int | None = None
        self._depth = 0

    # -- metadata ----------------------------------------------------------------------------------
    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    def type_counts(self) -> dict[str, int]:
        """How many tensors of each storage type (e.g. {"Q8_0": 304, "F32": 470})."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.kind.name] = counts.get(t.kind.name, 0) + 1
        return counts

    def describe_types(self) -> str:
        return ", ".join(f"{name} x{n}" for name, n in sorted(self.type_counts().items(), key=lambda kv: -kv[1]))

    # -- reads -------------------------------------------------------------------------------------
    def __enter__(self) -> GGUFFile:
        if self._depth == 0:
            self._fd = os.open(self.path, os.O_RDONLY)
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def entry(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise ConfigError(
                f"{self.path.name} has no tensor {name!r}",
                "the loader asked for a tensor the model needs",
                "use the complete GGUF file (a partial or different file cannot load)",
            ) from None

    def read(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Tensor ``name`` (rows ``r0:r1`` of dim 0 when given), in memory of its own: a float tensor of its
        torch shape for F32 / F16 / BF16, else its GGML blocks as uint8 ``[rows, bytes per row]`` (one row
        for a 0- or 1-D tensor)."""
        entry = self.entry(name)
        r0, r1 = (0, entry.rows) if rows is None else rows
        if not 0 <= r0 <= r1 <= entry.rows:
            raise IndexError(f"rows {r0}:{r1} of {name} with {entry.rows} rows")
        whole = (r0, r1) == (0, entry.rows)
        if not whole and not entry.row_aligned():
            raise ConfigError(
                f"{self.path.name}: rows of {name} ({entry.kind.name}, shape {entry.shape}) do not start on a block",
                "a part of a quantised tensor can only be read in whole blocks",
                "use a GGUF file converted by ComfyUI-GGUF's tools (rows are whole blocks there)",
            )
        if whole:
            offset, nbytes = entry.start, entry.nbytes
        else:
            offset = entry.start + entry.kind.row_bytes(r0 * entry.row_elements)
            nbytes = entry.kind.row_bytes((r1 - r0) * entry.row_elements)
        out = torch.empty(nbytes, dtype=torch.uint8)
        fd = self._fd if self._fd is not None else os.open(self.path, os.O_RDONLY)
        try:
            pread_exactly(fd, out, offset, self.path)
        finally:
            if self._fd is None:
                os.close(fd)
        part_shape = entry.shape if whole else (r1 - r0, *entry.shape[1:])
        if entry.kind.name in FLOAT_DTYPES:
            return out.view(FLOAT_DTYPES[entry.kind.name]).reshape(part_shape)
        return out.reshape(part_shape[0] if len(part_shape) > 1 else 1, -1)
