"""Adapters by diffusers transformer class (subclasses resolve through the MRO), from the family registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..errors import ConfigError
from .base import LatentFormat, ModelAdapter
from .families.registry import FAMILIES, family, family_of_class_name


def adapter_classes() -> dict[type, type[ModelAdapter]]:
    """Supported transformer classes -> adapter classes (built on call; diffusers imported lazily). Classes the
    installed diffusers lacks (a family newer than it) are left out: the other families keep working."""
    import diffusers

    table = {}
    for spec in FAMILIES:
        for name in (spec.transformer_class, *spec.more_transformer_classes):
            cls = getattr(diffusers, name, None)
            if cls is not None:
                table[cls] = spec.adapter()
    return table


def diffusers_class(name: str) -> type:
    """diffusers' class ``name``; a ConfigError naming the installed diffusers when it has no such class."""
    import diffusers

    cls = getattr(diffusers, name, None)
    if cls is None:
        raise ConfigError(
            f"the installed diffusers {diffusers.__version__} has no {name}",
            "this model's transformer is built with that diffusers class, which came in a later diffusers release",
            "upgrade diffusers (pip install -U diffusers; dit-parallel is tested with diffusers 0.42.1)",
        )
    return cls


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


def idle_weights(transformer_cls: type) -> Callable[[str], bool]:
    """Whether a parameter (diffusers' name) of ``transformer_cls`` is one its adapter never runs
    (``FamilySpec.idle_modules``): loaders leave those on "meta", unread, and byte accounting leaves them out."""
    starts = family(family_of(transformer_cls)).idle_modules
    return lambda name: bool(starts) and any(part.startswith(starts) for part in name.split("."))


def transformer_skeleton(model_cls: type, config: dict[str, Any]) -> nn.Module:
    """``weights.meta_model`` with the modules the family adds to the diffusers class for what ``config`` says
    the file holds (``FamilySpec.extra_modules``: e.g. a Wan Fun-Control file's reference-image conv), so that
    they load like the rest."""
    from .weights import meta_model, parameters_on_meta

    model = meta_model(model_cls, config)
    spec = family_of_class_name(str(config.get("_class_name", model_cls.__name__)))
    if spec is None or spec.extra_modules is None:
        return model
    with parameters_on_meta():
        extras = spec.extra_modules(config)
    for name, module in extras.items():
        model.add_module(name, module.eval().requires_grad_(False))
    return model
