"""Per-stage partial loading of a transformer for PipeFusion, straight from its safetensors files.

A stage builds the transformer's module tree with every parameter on the "meta" device (no
memory; buffers such as position tables are real, as the constructor computes them), then reads
from the safetensors files only the tensors it runs: its own blocks, plus the embedding modules
on the first stage and the output layers on the last. No rank ever holds the whole transformer,
in host memory or on the device; the other stages' parameters stay on "meta".

Which non-block parameters are "embedding" and which are "output layers" is found by tracing
the adapter's ``embed_full`` and ``project_out`` on a fully meta copy of the model (shapes only,
no data): the tensors each one touches. If tracing fails, both ends load every non-block tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ..errors import ConfigError
from ..pipefusion.stages import StagePlan, plan_stages
from .base import Conditioning, ModelAdapter
from .loading import PipelineComponents, _component_class, load_pipeline_components, read_model_index
from .registry import adapter_class_for

log = logging.getLogger(__name__)

SAFETENSORS_NAME = "diffusion_pytorch_model.safetensors"
SAFETENSORS_INDEX = "diffusion_pytorch_model.safetensors.index.json"


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


@dataclasses.dataclass(frozen=True)
class ExtraRoles:
    """Names of the non-block tensors the first stage (embed) and the last stage (final) need."""

    embed: frozenset[str]
    final: frozenset[str]
    traced: bool


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers is moved to the "meta" device (buffers are
    kept). Module constructors therefore allocate at most one parameter at a time, briefly."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


class _TensorUse(TorchFunctionMode):
    """Records which named tensors (by identity) are passed to torch functions."""

    def __init__(self, names: dict[int, str]):
        super().__init__()
        self.names, self.used = names, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and id(t) in self.names:
                self.used.add(self.names[id(t)])
        return func(*args, **kwargs)


def _named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def trace_extra_roles(model_cls: type, config: dict[str, Any]) -> ExtraRoles:
    """The tensors ``embed_full`` and ``project_out`` touch, found on a fully meta model."""
    with torch.device("meta"):
        skeleton = model_cls.from_config(config)
    adapter = adapter_class_for(model_cls)(skeleton)
    names = {id(t): n for n, t in _named_tensors(skeleton).items()}
    prefixes = block_prefixes(skeleton, adapter)
    extras = {n for n in names.values() if not n.startswith(tuple(prefixes))}
    try:
        p = adapter.plan.patch_size
        x = torch.zeros(1, adapter.plan.latent_channels, 2 * p, 2 * p, device="meta")
        dim = config.get("joint_attention_dim") or config.get("caption_channels") or config.get("cross_attention_dim")
        pooled_dim = config.get("pooled_projection_dim")
        cond = Conditioning(
            torch.zeros(1, 4, int(dim), device="meta"),
            torch.zeros(1, int(pooled_dim), device="meta") if pooled_dim else None,
        )
        one = torch.zeros(1, device="meta")
        with _TensorUse(names) as embed_use:
            acts = adapter.embed_full(x, one, cond, one)
        with _TensorUse(names) as final_use:
            adapter.project_out(acts)
    except Exception as exc:  # noqa: BLE001 - any failure only costs memory: load both ends fully
        log.warning("could not trace %s's embedding/output layers (%s); both ends load them all", model_cls, exc)
        return ExtraRoles(frozenset(extras), frozenset(extras), False)
    embed = embed_use.used & extras
    final = final_use.used & extras
    unused = extras - embed - final
    return ExtraRoles(frozenset(embed | unused), frozenset(final), True)


def block_prefixes(model: nn.Module, adapter: ModelAdapter) -> list[str]:
    """State-dict prefix of every block, in execution order (index = block number)."""
    return [f"{name}.{j}." for name in adapter.plan.block_lists for j in range(len(getattr(model, name)))]


def _weight_map(folder: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file of a diffusers model folder (single file or sharded)."""
    from safetensors import safe_open

    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        with open(index, encoding="utf-8") as f:
            mapping = json.load(f)["weight_map"]
        return {k: folder / v for k, v in mapping.items()}
    single = folder / SAFETENSORS_NAME
    if single.is_file():
        with safe_open(single, framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    found = ", ".join(sorted(p.name for p in folder.iterdir())) if folder.is_dir() else "no folder"
    raise ConfigError(
        f"{folder} has no {SAFETENSORS_NAME} (or {SAFETENSORS_INDEX}); found: {found}",
        "PipeFusion stages read only their own blocks' tensors, which needs safetensors files",
        "save the transformer with safe_serialization=True (diffusers' default), or run without pp",
    )


_DTYPE_SIZES = MappingProxyType(
    {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}
)


def _tensor_numels(files: dict[str, Path]) -> dict[str, int]:
    """Element count of every tensor, read from the safetensors headers (no data is read)."""
    out: dict[str, int] = {}
    for file in sorted(set(files.values())):
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                start, end = info["data_offsets"]
                out[name] = (end - start) // _DTYPE_SIZES.get(info["dtype"], 1)
    return out


def _set_tensor(model: nn.Module, name: str, value: torch.Tensor, parameter: bool) -> None:
    owner_name, _, leaf = name.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    if parameter:
        owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
    else:
        owner._buffers[leaf] = value


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """Where a stage reads its tensors: their names and element counts (no data), and a reader
    that yields (name, CPU tensor) for the names asked for."""

    description: str
    numels: dict[str, int]
    read: Callable[[list[str]], Iterator[tuple[str, torch.Tensor]]]


def folder_tensor_source(folder: Path) -> TensorSource:
    """The safetensors files of a diffusers model folder (one file or shards)."""
    from safetensors import safe_open

    files = _weight_map(folder)

    def read(names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        by_file: dict[Path, list[str]] = {}
        for n in names:
            by_file.setdefault(files[n], []).append(n)
        for file, group in sorted(by_file.items()):
            with safe_open(file, framework="pt", device="cpu") as f:
                for n in group:
                    yield n, f.get_tensor(n)

    return TensorSource(f"the safetensors files of {folder.parent}", _tensor_numels(files), read)


def load_stage_transformer(
    folder: str | Path,
    pp: int,
    stage: int,
    device: torch.device | str,
    dtype: torch.dtype,
    stage_weights: Sequence[float] | None = None,
) -> tuple[nn.Module, StagePlan, StageWeights]:
    """The transformer of the diffusers pipeline ``folder`` with only ``stage``'s tensors loaded on
    ``device`` in ``dtype`` (every other parameter stays on "meta"), the stage plan over ``pp``
    stages (``stage_weights``: see :func:`plan_stages`) and what this stage loaded."""
    folder = Path(folder)
    index = read_model_index(folder)
    model_cls = _component_class("transformer", index["transformer"], folder)
    with open(folder / "transformer" / "config.json", encoding="utf-8") as f:
        config = json.load(f)
    source = folder_tensor_source(folder / "transformer")
    return build_stage_transformer(model_cls, config, source, pp, stage, device, dtype, stage_weights)


def build_stage_transformer(
    model_cls: type,
    config: dict[str, Any],
    source: TensorSource,
    pp: int,
    stage: int,
    device: torch.device | str,
    dtype: torch.dtype,
    stage_weights: Sequence[float] | None = None,
) -> tuple[nn.Module, StagePlan, StageWeights]:
    """``model_cls(config)`` with only ``stage``'s tensors read from ``source`` (see
    :func:`load_stage_transformer`); names and shapes are checked against the model."""
    roles = trace_extra_roles(model_cls, config)
    with parameters_on_meta():
        model = model_cls.from_config(config)
    model.eval().requires_grad_(False)
    adapter = adapter_class_for(model_cls)(model)
    prefixes = block_prefixes(model, adapter)
    stages = plan_stages(len(prefixes), pp, stage_weights)
    mine = tuple(prefixes[b] for b in stages.blocks(stage))
    first, last = stage == 0, stage == stages.num_stages - 1
    numels = source.numels
    device = torch.device(device)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    def role(name: str) -> str | None:
        if name.startswith(mine):
            return "block"
        if name.startswith(tuple(prefixes)):
            return None
        if first and name in roles.embed:
            return "embed"
        if last and name in roles.final:
            return "final"
        return None

    wanted = {n: role(n) for n in (*params, *buffers)}
    missing = [n for n, r in wanted.items() if r and n in params and n not in numels]
    if missing:
        raise ConfigError(
            f"{len(missing)} parameter(s) of stage {stage} are not in {source.description} (e.g. {missing[0]})",
            "the files must hold every parameter of the model's config",
            "re-save the transformer with diffusers' save_pretrained, or use the model's published files",
        )
    loaded_bytes = {"block": 0, "embed": 0, "final": 0}
    for n, t in source.read([n for n, r in wanted.items() if r and n in numels]):
        expected = params[n].shape if n in params else buffers[n].shape
        if t.shape != expected:
            raise ConfigError(
                f"{n} in {source.description} has shape {tuple(t.shape)}, the model expects {tuple(expected)}",
                "the weights do not fit the model's config",
                "use the config that belongs to these weights (or the model's diffusers folder)",
            )
        t = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype, copy=t.device == device)
        _set_tensor(model, n, t, parameter=n in params)
        if n in params:
            loaded_bytes[wanted[n]] += t.numel() * t.element_size()
    buffer_bytes = 0
    for n, b in buffers.items():
        if wanted[n] and n not in numels:  # computed by the constructor (e.g. a position table)
            _set_tensor(model, n, b.to(device), parameter=False)
        elif not wanted[n]:
            _set_tensor(model, n, b.to("meta"), parameter=False)
    for b in model.buffers():
        if b.device.type != "meta":
            buffer_bytes += b.numel() * b.element_size()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    total = sum(numels.get(n, 0) for n in params) * itemsize
    all_blocks = sum(numels.get(n, 0) for n in params if n.startswith(tuple(prefixes))) * itemsize
    weights = StageWeights(
        stage=stage,
        num_stages=stages.num_stages,
        blocks=(stages.bounds[stage], stages.bounds[stage + 1]),
        block_bytes=loaded_bytes["block"],
        embed_bytes=loaded_bytes["embed"],
        final_bytes=loaded_bytes["final"],
        buffer_bytes=buffer_bytes,
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
    model, stages, weights = load_stage_transformer(path, pp, stage, device, dtype, stage_weights)
    comps.transformer = model
    return comps, stages, weights
