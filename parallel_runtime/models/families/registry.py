"""The model families: one line per folder, and the questions the rest of the engine asks about them.

Nothing outside ``models/families/<family>/`` names a family; it asks here (by id, by diffusers class, by the
tensor names of a file, by a shipped variant). Importing the registry is light (no torch, no diffusers).
"""

from __future__ import annotations

from collections.abc import Iterable

from ...errors import ConfigError
from .chroma.spec import FAMILY as CHROMA
from .flux.spec import FAMILY as FLUX
from .flux2.spec import FAMILY as FLUX2
from .hidream.spec import FAMILY as HIDREAM
from .hunyuan_video.spec import FAMILY as HUNYUAN_VIDEO
from .hunyuan_video15.spec import FAMILY as HUNYUAN_VIDEO15
from .ltx2.spec import FAMILY as LTX2
from .ltx_video.spec import FAMILY as LTX_VIDEO
from .pixart.spec import FAMILY as PIXART
from .qwen_image.spec import FAMILY as QWEN_IMAGE
from .sd3.spec import FAMILY as SD3
from .spec import FamilySpec
from .wan.spec import FAMILY as WAN
from .z_image.spec import FAMILY as Z_IMAGE

FAMILIES: tuple[FamilySpec, ...] = (
    FLUX,
    FLUX2,
    QWEN_IMAGE,
    SD3,
    PIXART,
    WAN,
    HUNYUAN_VIDEO,
    HUNYUAN_VIDEO15,
    LTX_VIDEO,
    Z_IMAGE,
    CHROMA,
    HIDREAM,
    LTX2,
)  # the order users see them in


def family_ids() -> tuple[str, ...]:
    return tuple(f.id for f in FAMILIES)


def labels(conjunction: str = "or") -> str:
    """The families' names for a message, e.g. "Flux, FLUX.2, ... or Wan"."""
    names = [f.label for f in FAMILIES]
    return f"{', '.join(names[:-1])} {conjunction} {names[-1]}" if len(names) > 1 else names[0]


def family(family_id: str) -> FamilySpec:
    """The family called ``family_id``; a clear error for an unknown one."""
    for spec in FAMILIES:
        if spec.id == family_id:
            return spec
    raise ConfigError(
        f"unknown model family {family_id!r}",
        "each family states its adapter, files, text encoders and defaults in its folder (models/families)",
        f"use one of: {', '.join(family_ids())}",
    )


def confirm_family(what: str, found: str, chosen: str | None) -> None:
    """Refuse a family chosen by hand (the loader's ``family``) that is not the one ``what`` (a file or folder
    name) holds; ``chosen`` None means detect."""
    if chosen is not None and chosen != found:
        raise ConfigError(
            f"{what} is a {found} transformer but family {chosen!r} was chosen",
            "the family decides the config, the conversion and the adapter that splits the model; a wrong one "
            "cannot load the weights",
            f"set family to {found!r} (or 'auto')",
        )


def find_family(family_id: str | None) -> FamilySpec | None:
    """The family called ``family_id``, or None."""
    return next((spec for spec in FAMILIES if spec.id == family_id), None)


def family_of_class_name(class_name: str) -> FamilySpec | None:
    """The family whose adapter drives the diffusers transformer class ``class_name`` (None: no family)."""
    return next(
        (spec for spec in FAMILIES if class_name in (spec.transformer_class, *spec.more_transformer_classes)), None
    )


def family_of_variant(variant: str) -> FamilySpec | None:
    """The family that ships the config ``variant`` (None: none does)."""
    return next((spec for spec in FAMILIES if variant in spec.variants), None)


def variants() -> dict[str, str]:
    """Every shipped variant -> its family's id."""
    return {variant: spec.id for spec in FAMILIES for variant in spec.variants}


def detection_order() -> tuple[FamilySpec, ...]:
    """The families in the order files are matched against their markers (highest priority first)."""
    return tuple(sorted(FAMILIES, key=lambda spec: -spec.detection_priority))


def detect(keys: Iterable[str]) -> FamilySpec | None:
    """The family of a transformer state dict from its tensor names (diffusers or original layout)."""
    keys = list(keys)
    for spec in detection_order():
        if any(marker in key for key in keys for marker in spec.markers):
            return spec
    return None


def lora_markers() -> tuple[tuple[str, str], ...]:
    """(LoRA module-name fragment, the families it suggests), the fragments one family declares first."""
    owners: dict[str, list[str]] = {}
    for spec in FAMILIES:
        for marker in spec.lora_markers:
            owners.setdefault(marker, []).append(spec.id)
    unique = [(m, ids[0]) for m, ids in owners.items() if len(ids) == 1]
    shared = [(m, " or ".join(ids)) for m, ids in owners.items() if len(ids) > 1]
    return tuple(unique + shared)


def check_pipeline_class(family_id: str, pipeline_class: str, where: str) -> None:
    """A ConfigError when a diffusers folder (``where``) of ``family_id`` is a pipeline the family refuses."""
    refusal = family(family_id).refused_pipelines.get(pipeline_class)
    if refusal is not None:
        raise ConfigError(f"{where} is a {pipeline_class} folder", *refusal)
