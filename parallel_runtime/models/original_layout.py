"""The original key layouts of single-file transformers, by family: what a file's shapes decide of the diffusers
config, which shipped variant fits, and the conversion to diffusers names.

Black Forest Labs' Flux.1 / FLUX.2 files, Stability's MMDiT files, PixArt's and Wan's own checkpoints name their
tensors differently from diffusers. Each family states its layout in its folder (``families/<family>/keys.py``,
an ``OriginalLayout``); these functions find it through the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .families.registry import family
from .families.spec import OriginalLayout
from .layout_shapes import Shapes, StateDict

__all__ = [
    "Shapes",
    "StateDict",
    "anchor_key",
    "config_from_metadata",
    "config_from_weights",
    "detect_variant",
    "layout",
    "to_diffusers",
]


def layout(family_id: str) -> OriginalLayout:
    """The original layout ``family_id`` states."""
    return family(family_id).original_layout()


def anchor_key(family_id: str) -> str:
    """A tensor every transformer of the family has in its original layout (diffusers layouts lack it)."""
    return layout(family_id).anchor


def config_from_weights(family_id: str, shapes: Shapes, base: Mapping[str, Any]) -> dict[str, Any]:
    """The diffusers config entries the weights (``shapes``) decide; ``base`` is the shipped config (+ overrides)."""
    return layout(family_id).config_from_weights(shapes, base)


def config_from_metadata(family_id: str, file_name: str, metadata: Mapping[str, str]) -> dict[str, Any]:
    """The diffusers config entries a .safetensors file's ``__metadata__`` decides (none for most families)."""
    read = layout(family_id).config_from_metadata
    return {} if read is None else read(file_name, metadata)


def detect_variant(family_id: str, shapes: Shapes) -> str:
    """Which shipped config fits (e.g. Flux dev or schnell, SD3.5 medium or large)."""
    return layout(family_id).variant_of(shapes)


def to_diffusers(family_id: str, state: StateDict, config: Mapping[str, Any]) -> StateDict:
    """Convert an original-layout state dict to diffusers names. Converted tensors are removed from
    ``state``; what is left there afterwards was not recognised."""
    return layout(family_id).to_diffusers(state, config)
