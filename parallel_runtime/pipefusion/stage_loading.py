"""Per-stage loading for PipeFusion: each rank reads only the tensors its stage runs.

A stage builds the transformer with every parameter on "meta" and reads from the files only its
own blocks (with the modules that run inside their calls: Wan VACE's hint blocks go with the main block they
follow), plus the embedding modules on the first stage and the output layers on the last
(:mod:`parallel_runtime.models.weights`). No rank ever holds the whole transformer, in host memory
or on the device; the other stages' parameters stay on "meta". Works from a diffusers folder's
safetensors files and from one single-file transformer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..models.extra_roles import held_prefixes, trace_extra_roles
from ..models.loading import PipelineComponents, component_class, load_pipeline_components, read_model_index
from ..models.registry import adapter_class_for, idle_weights, transformer_skeleton
from ..models.single_file import single_file_tensor_source, transformer_only
from ..models.weights import TensorSource, folder_tensor_source, gguf_held_bytes, load_tensors
from ..parallel.mesh import ParallelMesh
from ..parallel.stages import StagePlan, plan_stages


@dataclasses.dataclass(frozen=True)
class StageWeights:
    """What one stage loaded: its block range and bytes of parameters by role, plus buffers."""

    stage: int
    num_stages: int
    blocks: tuple[int, int]  # [first, last + 1)
    block_bytes: int
    embed_bytes: int  # embedding parameters (first stage)
    final_bytes: int  # output-layer parameters (last stage)
    buffer_bytes: int
    total_transformer_bytes: int  # every parameter of the transformer (from the file headers)
    all_block_bytes: int  # every block's parameters

    @property
    def param_bytes(self) -> int:
        return self.block_bytes + self.embed_bytes + self.final_bytes

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["param_bytes"] = self.param_bytes
        return out


def load_stage_transformer(
    folder: str | Path,
    pp: int,
    stage: int,
    device: torch.device | str,
    dtype: torch.dtype,
    stage_weights: Sequence[float] | None = None,
    storage: str = "auto",
) -> tuple[nn.Module, StagePlan, StageWeights]:
    """The transformer of the diffusers pipeline ``folder`` with only ``stage``'s tensors loaded on
    ``device`` in ``dtype`` (every other parameter stays on "meta"), the stage plan over ``pp``
    stages (``stage_weights``: see :func:`plan_stages`) and what this stage loaded. ``storage``: see
    ``models.weights.WEIGHT_STORAGE``."""
    folder = Path(folder)
    index = read_model_index(folder)
    model_cls = component_class("transformer", index["transformer"], folder)
    with open(folder / "transformer" / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    source = folder_tensor_source(folder / "transformer")
    return build_stage_transformer(model_cls, config, source, pp, stage, device, dtype, stage_weights, storage)


def build_stage_transformer(
    model_cls: type,
    config: dict[str, Any],
    source: TensorSource,
    pp: int,
    stage: int,
    device: torch.device | str,
    dtype: torch.dtype,
    stage_weights: Sequence[float] | None = None,
    storage: str = "auto",
) -> tuple[nn.Module, StagePlan, StageWeights]:
    """``model_cls(config)`` with only ``stage``'s tensors read from ``source`` (see
    :func:`load_stage_transformer`); names and shapes are checked against the model."""
    roles = trace_extra_roles(model_cls, config)
    model = transformer_skeleton(model_cls, config)
    adapter = adapter_class_for(model_cls)(model)
    idle = idle_weights(model_cls)
    per_block = held_prefixes(model, adapter)  # a block's own prefix and its companions' (Wan VACE hint blocks)
    prefixes = [p for block in per_block for p in block]
    stages = plan_stages(len(per_block), pp, stage_weights)
    mine = tuple(p for b in stages.blocks(stage) for p in per_block[b])
    first, last = stage == 0, stage == stages.num_stages - 1

    def role(name: str) -> str | None:
        if idle(name):  # never run (``FamilySpec.idle_modules``): never read
            return None
        if name.startswith(mine):
            return "block"
        if name.startswith(tuple(prefixes)):
            return None
        if first and name in roles.embed:
            return "embed"
        if last and name in roles.final:
            return "final"
        return None

    params = [n for n, _ in model.named_parameters() if not idle(n)]
    loaded = load_tensors(model, source, role, device, dtype, what=f"of stage {stage}", storage=storage)
    numels = source.numels
    itemsize = torch.empty(0, dtype=dtype).element_size()

    gguf_bytes = gguf_held_bytes(model, source, itemsize, storage)

    def held(name: str) -> int:  # bytes of a parameter as held (fp8 layers of an fp8 file: 1 byte)
        if gguf_bytes is not None:
            return gguf_bytes[name]
        fp8 = storage != "compute" and name in source.fp8 and name.endswith(".weight")
        return numels.get(name, 0) * (1 if fp8 else itemsize)

    total = sum(held(n) for n in params)
    all_blocks = sum(held(n) for n in params if n.startswith(tuple(prefixes)))
    weights = StageWeights(
        stage=stage,
        num_stages=stages.num_stages,
        blocks=(stages.bounds[stage], stages.bounds[stage + 1]),
        block_bytes=loaded.param_bytes.get("block", 0),
        embed_bytes=loaded.param_bytes.get("embed", 0),
        final_bytes=loaded.param_bytes.get("final", 0),
        buffer_bytes=loaded.buffer_bytes,
        total_transformer_bytes=total,
        all_block_bytes=all_blocks,
    )
    return model, stages, weights


def load_pipeline_stage(
    path: str | Path,
    pp: int,
    stage: int,
    device: torch.device | str,
    dtype: torch.dtype,
    stage_weights: Sequence[float] | None = None,
    parts: Sequence[str] = ("vae",),
    storage: str = "auto",
) -> tuple[PipelineComponents, StagePlan, StageWeights]:
    """:func:`~parallel_runtime.models.loading.load_pipeline_components` for a PipeFusion stage: the
    other ``parts`` ("vae", "text") as usual, the transformer with only this stage's tensors."""
    if "transformer" in parts:
        raise ConfigError(
            "load_pipeline_stage was asked for the whole transformer",
            "a PipeFusion stage loads only its own blocks",
            'pass parts without "transformer" (it is always loaded partially)',
        )
    comps = load_pipeline_components(path, device, dtype, parts)
    model, stages, weights = load_stage_transformer(path, pp, stage, device, dtype, stage_weights, storage)
    comps.transformer = model
    return comps, stages, weights


def load_single_file_stage(
    path: str | os.PathLike,
    pp: int,
    stage: int,
    device: str | torch.device,
    dtype: torch.dtype,
    stage_weights: Sequence[float] | None = None,
    family: str | None = None,
    storage: str = "auto",
    dequant_dtype: str = "default",
) -> tuple[PipelineComponents, StagePlan, StageWeights]:
    """PipeFusion from one file: (components, stage plan, stage weights) with only ``stage``'s
    tensors on ``device``: the stage reads just its own share of the file (see
    ``models.single_file.single_file_tensor_source``; a GGUF file's blocks stay quantised, dequantised
    with ``dequant_dtype``'s arithmetic)."""
    info, model_cls, source = single_file_tensor_source(path, family, dequant_dtype)
    model, stages, weights = build_stage_transformer(
        model_cls, dict(info.config), source, pp, stage, device, dtype, stage_weights, storage
    )
    return transformer_only(path, model, info.family, dict(info.scheduler_config)), stages, weights


def describe_stages(mesh: ParallelMesh, stages: StagePlan, weights: StageWeights | None) -> dict[str, Any]:
    """The stage plan and every rank's loaded weight bytes (collective over all ranks: every rank
    calls it at the same point, e.g. at the end of the load job)."""
    import torch.distributed as dist

    mine = {"rank": mesh.global_rank, **({} if weights is None else weights.as_dict())}
    ranks = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
    return {"stages": stages.describe(), "blocks_per_stage": list(stages.counts), "ranks": ranks}
