"""Building a transformer from a subset of its tensors, straight from files.

A model's module tree is built with every parameter on the "meta" device (no memory; buffers such
as position tables are real, as the constructor computes them); then only the tensors a caller
wants are read from a :class:`TensorSource` (the safetensors files of a diffusers folder, or a
converted single file) and put in place, with names and shapes checked against the model.
PipeFusion stages (``parallel_runtime.pipefusion.stage_loading``) and single files use it; which
tensors a stage needs is ``extra_roles``'. This module knows no model family.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .tensor_files import read_header

FP8_STORAGE = (torch.float8_e4m3fn, torch.float8_e5m2)
SAFETENSORS_NAME = "diffusion_pytorch_model.safetensors"
SAFETENSORS_INDEX = "diffusion_pytorch_model.safetensors.index.json"


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


def _tensor_numels(files: dict[str, Path]) -> dict[str, int]:
    """Element count of every tensor, read from the safetensors headers (no data is read)."""
    out: dict[str, int] = {}
    for file in sorted(set(files.values())):
        for name, info in read_header(file)[0].items():
            out[name] = math.prod(info.get("shape", []))
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
    that yields (name, CPU tensor) for the names asked for. ``fp8`` names the tensors the source
    holds in an fp8 dtype (read as stored); ``scales`` their float32 per-tensor scales (absent: 1)."""

    description: str
    numels: dict[str, int]
    read: Callable[[list[str]], Iterator[tuple[str, torch.Tensor]]]
    fp8: Mapping[str, torch.dtype] = dataclasses.field(default_factory=dict)
    scales: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    owned: bool = False  # read tensors are in memory of their own (not views of a file mapping): never copied
    shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # when known before reading
    ggml: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # GGUF: name -> GGMLType (read as stored)
    dequant_dtype: str = "default"  # GGUF: the arithmetic of dequantisation (models.gguf.dequant.DEQUANT_MODES)
    # ComfyUI's "fp8 scaled" files: the fp8 dtype every Linear of the model is held in (a weight or bias the
    # file stores wider is rounded to it on load, as ComfyUI's fp8 parameters round what is copied in)
    round_linear_to: torch.dtype | None = None


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


def meta_model(model_cls: type, config: dict[str, Any]) -> nn.Module:
    """``model_cls(config)`` in eval mode with every parameter on "meta" (no weights allocated)."""
    with parameters_on_meta():
        model = model_cls.from_config(config)
    return model.eval().requires_grad_(False)


@dataclasses.dataclass(frozen=True)
class LoadedTensors:
    """Bytes of parameters put in place by role, and of the buffers left on a real device."""

    param_bytes: dict[str, int]
    buffer_bytes: int


WEIGHT_STORAGE = ("auto", "compute", "fp8_e4m3fn")
"""How Linear weights are held: "auto" keeps an fp8 file's fp8 layers in fp8 (:class:`~.fp8.Fp8Linear`,
upcast per call) and the rest in the compute dtype; "compute" converts everything to the compute dtype;
"fp8_e4m3fn" also stores the blocks' other Linear weights in fp8 (per-tensor scale), as ComfyUI's
UNETLoader weight_dtype does."""


def linear_weights(model: nn.Module, names: Iterator[str] | list[str]) -> list[str]:
    """The names among ``names`` that are the weight of a plain nn.Linear of ``model``."""
    out = []
    for n in names:
        owner, _, leaf = n.rpartition(".")
        if leaf == "weight" and owner and type(model.get_submodule(owner)) is nn.Linear:
            out.append(n)
    return out


def _check_storage(storage: str) -> None:
    if storage not in WEIGHT_STORAGE:
        raise ConfigError(
            f"weight storage {storage!r}",
            "weights are kept as the file stores them, converted to the compute dtype, or stored in fp8",
            f"use one of {', '.join(WEIGHT_STORAGE)}",
        )


def load_tensors(
    model: nn.Module,
    source: TensorSource,
    role_of: Callable[[str], str | None],
    device: torch.device | str,
    dtype: torch.dtype,
    what: str = "",
    storage: str = "auto",
) -> LoadedTensors:
    """Read from ``source`` every tensor of ``model`` whose ``role_of(name)`` is not None and put it
    on ``device`` (floats in ``dtype``, fp8 Linear weights as :data:`WEIGHT_STORAGE` says); every other
    parameter stays on "meta" and its buffers move there too. Raises ConfigError for a wanted parameter
    missing from the source or a wrong shape (``what``, e.g. "of stage 1", says whose parameters in
    that message). Each tensor is read and converted on its own: no full-precision copy of an fp8 file."""
    from .base import COMPUTE_DTYPE_ATTR
    from .fp8 import fp8_layers, quantise_per_tensor, set_scale, swap_to_fp8
    from .gguf import placement
    from .host_heap import release_freed_heap

    _check_storage(storage)
    release_freed_heap()  # the model's construction temporaries: not resident next to the weights read now
    numels = source.numels
    device = torch.device(device)
    wanted = {n: role_of(n) for n in (*dict(model.named_parameters()), *dict(model.named_buffers()))}
    chosen = [n for n, r in wanted.items() if r and n in numels]
    layer_fp8 = source.round_linear_to
    widened = set(linear_weights(model, [n for n in chosen if n not in source.fp8])) if layer_fp8 else set()
    stored_fp8 = set(linear_weights(model, [n for n in chosen if n in source.fp8])) | widened
    keep = set() if storage == "compute" else stored_fp8
    fp8_biases = {n[: -len("weight")] + "bias" for n in stored_fp8} if layer_fp8 else set()
    in_fp32 = kept_in_fp32(model, list(wanted))  # as diffusers' from_pretrained keeps them (Wan's rope, time)
    quantise = set()
    if storage == "fp8_e4m3fn":
        blocks = [n for n in chosen if wanted[n] == "block" and n not in keep]
        quantise = set(linear_weights(model, blocks))
    swap_to_fp8(model, sorted(keep | quantise))
    if source.ggml and storage == "fp8_e4m3fn":
        raise ConfigError(
            f"{source.description} is a GGUF file and the weights were asked for in fp8",
            "a GGUF file's weights are already quantised; they are kept in their GGML blocks",
            'use weights "as file" (or "convert to dtype" to dequantise them once, at load)',
        )
    gguf_kept = placement.prepare(model, source, chosen, in_fp32) if storage != "compute" else set()
    scales: dict[str, torch.Tensor] = {n: source.scales[n] for n in keep if n in source.scales}
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    missing = [n for n, r in wanted.items() if r and n in params and n not in numels]
    if missing:
        raise ConfigError(
            f"{len(missing)} parameter(s) {what + ' ' if what else ''}are not in {source.description} (e.g. {missing[0]})",
            "the files must hold every parameter of the model's config",
            "re-save the transformer with diffusers' save_pretrained, or use the model's published files",
        )
    loaded: dict[str, int] = {}
    for n, t in source.read([n for n, r in wanted.items() if r and n in numels]):
        expected = params[n].shape if n in params else buffers[n].shape
        shape = tuple(source.shapes[n]) if n in source.ggml else tuple(t.shape)  # GGUF blocks: the logical shape
        if shape != tuple(expected):
            raise ConfigError(
                f"{n} in {source.description} has shape {shape}, the model expects {tuple(expected)}",
                "the weights do not fit the model's config",
                "use the config that belongs to these weights (or the model's diffusers folder)",
            )
        if n in source.ggml:  # GGUF: held as stored in a GGUFLinear, or dequantised here
            t, kept_bytes = placement.place(
                model, n, t, source, gguf_kept, device, torch.float32 if n in in_fp32 else dtype
            )
            if t is None:
                loaded[wanted[n]] = loaded.get(wanted[n], 0) + kept_bytes
                continue
        if n in widened:  # a Linear weight stored wider in a scaled-fp8 file: held in fp8, as ComfyUI holds it
            t = t.to(layer_fp8)
        elif n in fp8_biases:  # its whole layer is fp8 in ComfyUI: the bias is rounded too
            t = t.to(layer_fp8).to(t.dtype)
        if n in quantise:
            t, scales[n] = quantise_per_tensor(t)
        elif t.dtype in FP8_STORAGE and n not in keep:  # an fp8 tensor computed in the compute dtype
            scale = source.scales.get(n)
            t = t.to(torch.float32) * scale if scale is not None else t
            t = t.to(torch.float32 if n in in_fp32 else dtype)
        float_dtype = torch.float32 if n in in_fp32 else dtype
        target = t.dtype if n in keep or n in quantise or not t.is_floating_point() else float_dtype
        t = t.to(device=device, dtype=target, copy=t.device == device and t.dtype == target and not source.owned)
        _set_tensor(model, n, t, parameter=n in params)
        if n in params:
            loaded[wanted[n]] = loaded.get(wanted[n], 0) + t.numel() * t.element_size()
    for n, b in buffers.items():
        if n not in wanted:  # an fp8 layer's scale: set below
            continue
        if wanted[n] and n not in numels:  # computed by the constructor (e.g. a position table)
            _set_tensor(model, n, b.to(device), parameter=False)
        elif not wanted[n]:
            _set_tensor(model, n, b.to("meta"), parameter=False)
    layers = fp8_layers(model)
    for n, scale in scales.items():
        set_scale(layers[n.rpartition(".")[0]], scale, device)
    for layer in layers.values():
        if layer.weight_scale.device.type == "meta" and layer.weight.device.type != "meta":
            set_scale(layer, torch.ones(()), device)
    if layers or gguf_kept:
        setattr(model, COMPUTE_DTYPE_ATTR, dtype)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers() if b.device.type != "meta")
    return LoadedTensors(loaded, buffer_bytes)


def gguf_held_bytes(model: nn.Module, source: TensorSource, itemsize: int, storage: str) -> dict[str, int] | None:
    """Bytes each parameter of ``model`` holds once loaded from the GGUF ``source`` (None for other sources)."""
    if not source.ggml:
        return None
    from .gguf.placement import held_bytes

    names = [n for n, _ in model.named_parameters()]
    return held_bytes(model, source if storage != "compute" else dataclasses.replace(source, ggml={}), itemsize,
                      kept_in_fp32(model, names))  # fmt: skip


def cast_model(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """``model`` on ``device`` in ``dtype``, except the modules its class keeps in float32
    (``_keep_in_fp32_modules``, e.g. Wan's rope tables, time embedder and modulation tables), as diffusers'
    ``from_pretrained`` keeps them. Tensors are cast one by one, so a kept table is never rounded first."""
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    in_fp32 = kept_in_fp32(model, names)
    for owner_name, owner in model.named_modules():
        for name, tensor in list(owner.named_parameters(recurse=False)) + list(owner.named_buffers(recurse=False)):
            if tensor is None:
                continue
            full = f"{owner_name}.{name}" if owner_name else name
            target = torch.float32 if full in in_fp32 else dtype
            moved = tensor.to(device=device, dtype=target if tensor.is_floating_point() else None)
            if isinstance(tensor, nn.Parameter):
                setattr(owner, name, nn.Parameter(moved, requires_grad=False))
            else:
                owner.register_buffer(name, moved, persistent=name not in owner._non_persistent_buffers_set)
    return model


def kept_in_fp32(model: nn.Module, names: list[str]) -> set[str]:
    """Those of ``names`` (parameter / buffer names) inside a module the model's class keeps in float32
    (``_keep_in_fp32_modules``)."""
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    return {n for n in names if any(k in n.split(".") for k in keep)}
