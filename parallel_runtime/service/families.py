"""The model families as the node layer sees them: choices, names and what a graph must know of each.

The nodes name no family; they ask here (which asks ``models.families.registry``). Light to import: no torch,
no diffusers (ComfyUI imports every node pack at its start).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..models.families.registry import family_ids, find_family

AUTO = "auto"


def family_choices() -> tuple[str, ...]:
    """The loader's family choices: "auto" (detect from the files), then every family's id."""
    return (AUTO, *family_ids())


def label(family_id: str) -> str:
    """The name users read for the family (its id when unknown)."""
    spec = find_family(family_id)
    return spec.label if spec is not None else family_id


def comfy_text_encoders(family_id: str) -> str | None:
    """ComfyUI's own nodes that encode prompts for the family (None when unknown)."""
    spec = find_family(family_id)
    return spec.text.comfy_nodes if spec is not None else None


def takes_guidance(family_id: str) -> bool:
    """Whether the family embeds a guidance value (FluxGuidance / the sampler's guidance input)."""
    spec = find_family(family_id)
    return spec is not None and spec.distilled_guidance


def conditioning_keys(family_id: str) -> tuple[str, ...]:
    """ComfyUI CONDITIONING options beyond text the family takes (e.g. WanImageToVideo's start image)."""
    spec = find_family(family_id)
    return spec.comfy_conditioning.keys if spec is not None and spec.comfy_conditioning is not None else ()


def check_extras(family_id: str, extras: Any, expected: Mapping[str, int | None], where: str) -> None:
    """The family's check that one entry's ``Conditioning.extras`` suit the model (raises ConfigError)."""
    spec = find_family(family_id)
    if spec is not None and spec.comfy_conditioning is not None and spec.comfy_conditioning.check_extras:
        spec.comfy_conditioning.check_extras(extras, expected, where)


def conditioning_extras(family_id: str, options: Mapping[str, Any], expected: Mapping[str, int | None], where: str):
    """What the family adds to the runtime Conditioning from one entry's ``options`` (``Conditioning.extras``;
    None when it adds nothing)."""
    spec = find_family(family_id)
    if spec is None or spec.comfy_conditioning is None:
        return None
    return spec.comfy_conditioning.to_extras(options, expected, where)
