"""Adapter registry keyed by the diffusers transformer class (subclasses resolve through the MRO)."""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError
from .base import LatentFormat, ModelAdapter


def adapter_classes() -> dict[type, type[ModelAdapter]]:
    """Supported transformer classes -> adapter classes (built on call; diffusers imported lazily)."""
    from diffusers import (
        Flux2Transformer2DModel,
        FluxTransformer2DModel,
        PixArtTransformer2DModel,
        QwenImageTransformer2DModel,
        SD3Transformer2DModel,
        WanTransformer3DModel,
    )

    from .flux import FluxAdapter
    from .flux2 import Flux2Adapter
    from .pixart import PixArtAdapter
    from .qwen_image import QwenImageAdapter
    from .sd3 import SD3Adapter
    from .wan import WanAdapter

    return {
        FluxTransformer2DModel: FluxAdapter,
        SD3Transformer2DModel: SD3Adapter,
        PixArtTransformer2DModel: PixArtAdapter,
        QwenImageTransformer2DModel: QwenImageAdapter,
        Flux2Transformer2DModel: Flux2Adapter,
        WanTransformer3DModel: WanAdapter,
    }


def supported_class_names() -> list[str]:
    return [cls.__name__ for cls in adapter_classes()]


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
    """Family name ("flux", "sd3", "pixart", "qwen-image", "flux2") of a transformer class."""
    return adapter_class_for(transformer_cls).family


def get_adapter(transformer: nn.Module, latent_format: LatentFormat | None = None) -> ModelAdapter:
    """The adapter driving ``transformer``; ``latent_format`` overrides the family's default
    (e.g. ``LatentFormat.from_vae_config(vae.config)``)."""
    return adapter_class_for(type(transformer))(transformer, latent_format)
