"""The :class:`~.keymap.ModelKeys` table of a loaded model: what a LoRA can patch, by name and shape."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..families.registry import find_family
from ..gguf.linear import parameter_shapes
from .keymap import EncoderKeys, ModelKeys, Shape, canonical_encoder_name
from .routing import Routing, identity_routing, probe_routing
from .skeleton import original_skeleton

log = logging.getLogger(__name__)


def encoder_kind(module: nn.Module) -> str:
    """ "clip" or "t5" (the naming families LoRA trainers use), else the class name."""
    name = type(module).__name__
    if name.startswith("CLIPText"):
        return "clip"
    if name.startswith("T5") or name.startswith("UMT5"):
        return "t5"
    return name


def encoder_keys(family: str, encoders: Mapping[str, nn.Module]) -> dict[str, EncoderKeys]:
    """Text encoders of a pipeline (component -> module) with the roles ComfyUI gives them."""
    spec = find_family(family)
    roles = spec.text.lora_roles if spec is not None else {}
    out = {}
    for component, module in encoders.items():
        if component not in roles:
            continue
        kind = encoder_kind(module)
        shapes = parameter_shapes(module)
        tensors = {canonical_encoder_name(name, kind): (name, shape) for name, shape in shapes.items()}
        out[component] = EncoderKeys(roles[component], tensors)
    return out


def model_keys(
    family: str,
    transformer: nn.Module | None,
    config: Mapping[str, Any],
    original: Mapping[str, Shape] | None = None,
    encoders: Mapping[str, nn.Module] | None = None,
) -> ModelKeys:
    """The key table of a loaded model. ``original``: the original-layout tensors of a single-file
    model (its header); None computes them from ``config`` for the families that have one."""
    params: dict[str, Shape] = {}
    if transformer is not None:
        params = parameter_shapes(transformer)  # a GGUF layer's logical shape, not its blocks
    layout: dict[str, Shape] = {}
    if transformer is not None:
        layout = dict(original) if original is not None else (original_skeleton(family, config) or {})
    routing = None
    if layout and transformer is not None:
        try:
            routing = _parameters_only(probe_routing(family, layout, config), params)
        except Exception as exc:  # noqa: BLE001 - only original-layout names are lost: say so, go on
            log.warning("%s: LoRA names of the original layout are not available (%s)", family, exc)
            layout = {}
    if routing is not None:
        unrouted = {p: params[p] for p in params if p not in routing.owner}
        if unrouted:  # a parameter the original layout does not store: patchable under its own name
            extra = identity_routing(unrouted)
            routing = Routing({**routing.routes, **extra.routes}, {**routing.owner, **extra.owner})
    else:
        routing = identity_routing(params)
    return ModelKeys(family, params, layout, routing, encoder_keys(family, encoders or {}))


def _parameters_only(routing: Routing, params: Mapping[str, Shape]) -> Routing:
    """Routes to parameters only (a converted buffer, e.g. SD3's position table, is not patched)."""
    routes = {name: route for name, route in routing.routes.items() if all(p.param in params for p in route.pieces)}
    owner = {param: name for param, name in routing.owner.items() if name in routes}
    return Routing(routes, owner)
