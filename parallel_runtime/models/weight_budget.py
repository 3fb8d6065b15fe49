"""How many bytes of weights each block of a transformer holds, from its config alone (no weights).

The layout planner splits a model that does not fit one device into PipeFusion stages; what a stage
holds is its blocks plus the embedding layers (first stage) or the output layers (last stage). This
builds the module tree on the "meta" device, finds which tensors are embedding / output layers the way
per-stage loading does (``extra_roles.trace_extra_roles``) and counts each parameter in the bytes it will
be held in: the compute dtype's, or one byte for a Linear weight kept in fp8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

import torch

from .extra_roles import held_prefixes, trace_extra_roles
from .registry import adapter_class_for, idle_weights
from .weights import WEIGHT_STORAGE, gguf_held_bytes, linear_weights


@dataclasses.dataclass(frozen=True)
class WeightBudget:
    """Bytes held per block (execution order), by the embedding layers and by the output layers."""

    blocks: tuple[int, ...]
    embed: int
    final: int

    @property
    def total(self) -> int:
        return sum(self.blocks) + self.embed + self.final


def weight_budget(
    model_cls: type,
    config: dict[str, Any],
    run_bytes: int,
    fp8_names: Collection[str] = (),
    storage: str = "auto",
    gguf_source: Any = None,
) -> WeightBudget:
    """The budget of ``model_cls(config)`` held in ``run_bytes``-byte floats; ``fp8_names`` are the (diffusers)
    names a file stores in fp8, kept so unless ``storage`` is "compute" ("fp8_e4m3fn": every block Linear);
    ``gguf_source`` (a GGUF file's ``TensorSource``): its Linear weights count in their GGML bytes."""
    if storage not in WEIGHT_STORAGE:
        raise ValueError(f"storage {storage!r} is not one of {WEIGHT_STORAGE}")
    with torch.device("meta"):
        model = model_cls.from_config(config)
    adapter = adapter_class_for(model_cls)(model)
    held_by_block = held_prefixes(model, adapter)  # each block with the modules that run in its call
    prefixes = [p for block in held_by_block for p in block]
    params = {n: p for n, p in model.named_parameters() if not idle_weights(model_cls)(n)}  # what is held
    linear = set(linear_weights(model, list(params)))
    fp8 = set(fp8_names)
    gguf = gguf_held_bytes(model, gguf_source, run_bytes, storage) if gguf_source is not None else None

    def held(name: str) -> int:
        if gguf is not None:
            return gguf[name]
        in_block = name.startswith(tuple(prefixes))
        kept = name in linear and ((storage != "compute" and name in fp8) or (storage == "fp8_e4m3fn" and in_block))
        return params[name].numel() * (1 if kept else run_bytes)

    roles = trace_extra_roles(model_cls, config)
    blocks = tuple(sum(held(n) for n in params if n.startswith(block)) for block in held_by_block)
    embed = sum(held(n) for n in params if n in roles.embed)
    final = sum(held(n) for n in params if n in roles.final and n not in roles.embed)
    return WeightBudget(blocks, embed, final)
