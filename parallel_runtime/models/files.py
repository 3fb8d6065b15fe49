"""Facts about model files read without loading weights: safetensors headers and the family of a
transformer from its tensor names (each family's markers, ``families.registry.detect``)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from .families.registry import detect


def read_safetensors_header(file: str | os.PathLike) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", ...} from a .safetensors header (reads only the header)."""
    from .tensor_files import read_header

    return read_header(file)[0]


def detect_family(keys: Iterable[str]) -> str | None:
    """Family id of a transformer state dict from its tensor names (diffusers or original layout)."""
    spec = detect(keys)
    return None if spec is None else spec.id
