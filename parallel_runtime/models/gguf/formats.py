"""The GGML tensor types a GGUF diffusion file may hold, and their storage geometry.

A GGML type stores a tensor's elements in fixed-size blocks along its innermost dimension (a "row" in
GGML's terms, the last dimension of the torch shape): ``elements`` values in ``nbytes`` bytes. Plain
float types are blocks of one element. The ids are GGUF's (``ggml_type``), the names llama.cpp's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

from ...errors import ConfigError

QK_K = 256  # elements of a K-quant or IQ4_XS super-block
QK = 32  # elements of a legacy (Q4_0 ... Q8_0) or IQ4_NL block


@dataclasses.dataclass(frozen=True)
class GGMLType:
    """One storage type: its GGUF id, name and block geometry."""

    id: int
    name: str
    elements: int  # values per block
    nbytes: int  # bytes per block
    packed: bool  # True: blocks of quantised values; False: plain floats (F32, F16, BF16)

    def row_bytes(self, row_elements: int) -> int:
        """Bytes of ``row_elements`` consecutive values (a multiple of the block size)."""
        return row_elements // self.elements * self.nbytes

    def tensor_bytes(self, shape: tuple[int, ...]) -> int:
        return self.row_bytes(math.prod(shape))

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / self.elements


_TYPES = (
    GGMLType(0, "F32", 1, 4, False),
    GGMLType(1, "F16", 1, 2, False),
    GGMLType(30, "BF16", 1, 2, False),
    GGMLType(8, "Q8_0", QK, 2 + QK, True),
    GGMLType(6, "Q5_0", QK, 2 + 4 + QK // 2, True),
    GGMLType(7, "Q5_1", QK, 2 + 2 + 4 + QK // 2, True),
    GGMLType(2, "Q4_0", QK, 2 + QK // 2, True),
    GGMLType(3, "Q4_1", QK, 2 + 2 + QK // 2, True),
    GGMLType(10, "Q2_K", QK_K, QK_K // 16 + QK_K // 4 + 2 + 2, True),
    GGMLType(11, "Q3_K", QK_K, QK_K // 8 + QK_K // 4 + 12 + 2, True),
    GGMLType(12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K // 2, True),
    GGMLType(13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2, True),
    GGMLType(14, "Q6_K", QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, True),
    GGMLType(20, "IQ4_NL", QK, 2 + QK // 2, True),
    GGMLType(23, "IQ4_XS", QK_K, 2 + 2 + QK_K // 64 + QK_K // 2, True),
)
SUPPORTED: Mapping[int, GGMLType] = MappingProxyType({t.id: t for t in _TYPES})
BY_NAME: Mapping[str, GGMLType] = MappingProxyType({t.name: t for t in _TYPES})
F32, F16, BF16 = BY_NAME["F32"], BY_NAME["F16"], BY_NAME["BF16"]


def ggml_type(type_id: int, tensor: str = "", file: str = "") -> GGMLType:
    """The supported type ``type_id`` (a ConfigError naming the tensor and the file otherwise)."""
    found = SUPPORTED.get(int(type_id))
    if found is not None:
        return found
    try:
        import gguf

        name = gguf.GGMLQuantizationType(int(type_id)).name
    except (ImportError, ValueError):
        name = f"type id {int(type_id)}"
    where = f"{file}: tensor {tensor}" if tensor else file or "a tensor"
    raise ConfigError(
        f"{where} is stored as {name}",
        f"GGUF weights are read in the types ComfyUI-GGUF reads: {', '.join(BY_NAME)}",
        "use a GGUF file quantised to one of these types (e.g. Q8_0, Q5_K_M, Q4_K_M)",
    )
