"""The original-layout tensor names and shapes of a model loaded from a diffusers folder.

A single-file model tells its original layout by its file header. A diffusers folder does not, yet
LoRA files for it are mostly written against the original layout (kohya ``lora_unet_double_blocks_...``,
ComfyUI ``diffusion_model....``). A family whose LoRA files do so states that layout as a function of the
diffusers config (``OriginalLayout.skeleton`` in its folder's ``keys.py``): names and shapes only, the
inverse of its ``config_from_weights``. Which rows of which diffusers tensor each name holds is NOT
stated there: :func:`routing.probe_routing` asks the family's converter. Tests check every skeleton
against the model classes of ComfyUI itself and by converting it to exactly the diffusers model's tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..families.registry import find_family

Shape = tuple[int, ...]


def original_skeleton(family: str, config: Mapping[str, Any]) -> dict[str, Shape] | None:
    """The original layout of ``family`` for a diffusers ``config`` (None: no known original layout)."""
    spec = find_family(family)
    build = spec.original_layout().skeleton if spec is not None else None
    return build(config) if build else None
