"""Adapters by diffusers transformer class (subclasses resolve through the MRO), from the family registry."""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError
from .base import LatentFormat, ModelAdapter
from .families.registry import FAMILIES


def adapter_classes() -> dict[type, type[ModelAdapter]]:
    """Supported transformer classes -> adapter classes (built on call; diffusers imported lazily)."""
    import diffusers

    return {
        getattr(diffusers, name): spec.adapter()
        for spec in FAMILIES
        for name in (spec.transformer_class, *spec.more_transformer_classes)
    }


def supported_class_names() -> list[str]:
    return [name for spec in FAMILIES for name in (spec.transformer_class, *spec.more_transformer_classes)]


def adapter_class_for(transformer_cls: type) -> type[ModelAdapter]:
    """The adapter class registered for ``transformer_cls`` or its nearest registered base class."""
    table = adapter_classes()
    for cls in getattr(transformer_cls, "__mro__", (transformer_cls,)):
        if cls in table:
            return table[cls]
    name = getattr(transformer_cls, "__name__", repr(transformer_cls))
    raise ConfigError(
        f"transformer class {name} is not supported",
        "each model family needs an adapter that knows how to split its tokens and run its blocks",
        f"use a model whose transformer is one of: {', '.join(supported_class_names())}",
    )


def family_of(transformer_cls: type) -> str:
    """The id of the family whose adapter drives ``transformer_cls`` (see ``families.registry``)."""
    return adapter_class_for(transformer_cls).family


def get_adapter(transformer: nn.Module, latent_format: LatentFormat | None = None) -> ModelAdapter:
    """The adapter driving ``transformer``; ``latent_format`` overrides the family's default
    (e.g. ``LatentFormat.from_vae_config(vae.config)``)."""
    return adapter_class_for(type(transformer))(transformer, latent_format)
