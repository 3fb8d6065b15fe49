"""Load a transformer from ONE file, as ComfyUI users keep them in ``models/diffusion_models``.

``flux1-dev.safetensors`` (Black Forest Labs' layout), ``sd3_medium.safetensors`` /
``sd3.5_medium.safetensors`` / ``sd3.5_large.safetensors`` (Stability's layout, often with a
``model.diffusion_model.`` prefix next to VAE / text-encoder tensors), PixArt ``.safetensors`` /
``.pth`` (PixArt's layout). Nothing is fetched from a hub: the family is detected from the tensor
names (``files.detect_family``), the variant from a few marker tensors, and the diffusers config
is a copy shipped in the family's folder (``models/families/<family>/configs/<variant>/``) with everything
the weights decide (depth, width, channels, text widths, optional parts) read from the file's header. The
weights are then converted to diffusers names (``original_layout``) and assigned to a transformer built
with its parameters on the "meta" device, so no random initialisation is ever materialised.

A single file holds only the transformer: prompts are encoded and latents decoded by ComfyUI's
own text-encoder and VAE nodes (the parallel sampler takes CONDITIONING and returns a LATENT).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .families.registry import confirm_family, family_of_variant, labels, variants
from .families.registry import family as family_spec
from .files import detect_family
from .loading import PipelineComponents
from .original_layout import (
    Shapes,
    StateDict,
    anchor_key,
    config_from_metadata,
    config_from_weights,
    detect_variant,
    to_diffusers,
)
from .tensor_files import read_header
from .weights import FP8_STORAGE, TensorSource, cast_model, load_tensors

log = logging.getLogger(__name__)

SAFETENSORS_SUFFIXES: tuple[str, ...] = (".safetensors", ".sft")
GGUF_SUFFIX = ".gguf"  # ComfyUI-GGUF's quantised files (models/gguf)
SINGLE_FILE_SUFFIXES: tuple[str, ...] = (*SAFETENSORS_SUFFIXES, ".pth", ".pt", GGUF_SUFFIX)
TRANSFORMER_PREFIX = "model.diffusion_model."  # ComfyUI / Stability full checkpoints
_SCALED_FP8_MARKERS = ("scaled_fp8", ".scale_weight", ".scale_input")


@dataclasses.dataclass(frozen=True)
class SingleFileInfo:
    """What a single file holds, read from its header (no weights loaded)."""

    path: Path
    family: str
    variant: str
    config: dict[str, Any]  # diffusers transformer config: shipped variant + what the weights decide
    scheduler_config: dict[str, Any]
    prefix: str  # "model.diffusion_model." when the transformer sits inside a full checkpoint


def shipped_config(variant: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(transformer config, scheduler config) shipped for ``variant`` (in its family's folder)."""
    spec = family_of_variant(variant)
    if spec is None:
        raise ConfigError(
            f"unknown model variant {variant!r}",
            "single files are loaded with a config shipped for each published variant",
            f"use one of {', '.join(variants())}, or leave the variant empty to detect it",
        )
    folder = spec.config_folder(variant)
    configs = []
    for name in ("config.json", "scheduler_config.json"):
        entry = folder / name
        configs.append(json.loads(entry.read_text(encoding="utf-8")) if entry.is_file() else {})
    return configs[0], configs[1]


def existing_model_file(path: str | os.PathLike) -> Path:
    """``path`` as a Path when it is a single-file model; a clear error otherwise."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(
            f"model file {p} does not exist" if not p.exists() else f"{p} is not a file",
            "a single-file model is one .safetensors or .gguf (or PixArt .pth) transformer file",
            "pick a file under ComfyUI/models/diffusion_models, or a diffusers folder",
        )
    if not p.name.endswith(SINGLE_FILE_SUFFIXES):
        raise ConfigError(
            f"{p.name} is not a model file",
            f"single-file transformers end in {', '.join(SINGLE_FILE_SUFFIXES)}",
            "pick a .safetensors transformer file (models/diffusion_models) or a diffusers folder",
        )
    return p


def _load_pickled(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a .pth / .pt checkpoint (weights only, memory-mapped when possible)."""
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ConfigError(
            f"{path.name} holds Python objects besides tensors",
            f"pickled checkpoints are read with weights_only=True, so no code runs while loading ({exc})",
            "convert the file to .safetensors, or use the model's .safetensors release",
        ) from None
    while isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise ConfigError(
            f"{path.name} holds no state dict",
            "a .pth model file must hold a mapping from tensor names to tensors",
            "use the .safetensors file of the model",
        )
    return {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}


def _file_shapes(path: Path) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """(tensor name -> shape, the ``__metadata__`` of a .safetensors file: empty for other files)."""
    if path.name.lower().endswith(GGUF_SUFFIX):
        from .gguf.model_file import allowed_families
        from .gguf.reader import GGUFFile

        file = GGUFFile(path)
        allowed_families(file)  # a text encoder, an LLM or another architecture: refused by name here
        return {k: t.shape for k, t in file.tensors.items()}, {}
    if path.name.endswith(SAFETENSORS_SUFFIXES):
        header, metadata = read_header(path)
        return {k: tuple(v.get("shape", ())) for k, v in header.items()}, dict(metadata)
    return {k: tuple(v.shape) for k, v in _load_pickled(path).items()}, {}


def _transformer_prefix(names: Any) -> str:
    return TRANSFORMER_PREFIX if any(k.startswith(TRANSFORMER_PREFIX) for k in names) else ""


def inspect_single_file(
    path: str | os.PathLike,
    family: str | None = None,
    variant: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SingleFileInfo:
    """Family, variant and diffusers config of a single-file transformer, from its header only.

    ``family`` / ``variant`` (e.g. "flux" / "flux-schnell") check or replace detection;
    ``overrides`` set config values the weights cannot show (e.g. a PixArt head width)."""
    p = existing_model_file(path)
    all_shapes, metadata = _file_shapes(p)
    prefix = _transformer_prefix(all_shapes)
    shapes: Shapes = {k[len(prefix) :]: v for k, v in all_shapes.items() if k.startswith(prefix)}
    found = detect_family(shapes)
    if found is None:
        raise ConfigError(
            f"{p.name} does not look like a {labels()} transformer",
            "its tensor names match none of the supported families (is it a VAE, a text encoder or a LoRA?)",
            "use a transformer file (models/diffusion_models) of a supported family, or a diffusers folder",
        )
    confirm_family(p.name, found, family)
    if anchor_key(found) not in shapes:
        raise ConfigError(
            f"{p.name} holds a {found} transformer under diffusers' tensor names, not its original layout",
            "single files are read in the layout their authors publish (Black Forest Labs, Stability, PixArt)",
            "save it as transformer/diffusion_pytorch_model.safetensors in a diffusers folder with its config.json, "
            "or use the original single file",
        )
    if p.name.lower().endswith(GGUF_SUFFIX):
        from .gguf.model_file import check_family
        from .gguf.reader import GGUFFile

        check_family(GGUFFile(p), found)
    if variant is None:
        variant = detect_variant(found, shapes)
    elif variants().get(variant, found) != found:
        raise ConfigError(
            f"variant {variant!r} is a {variants()[variant]} model but {p.name} holds a {found} transformer",
            "the variant picks the shipped config, which must belong to the file's family",
            f"use a {found} variant ({', '.join(family_spec(found).variants)}) or leave it empty",
        )
    base, scheduler = shipped_config(variant)
    overrides = dict(overrides or {})
    from_file = {
        **config_from_weights(found, shapes, {**base, **overrides}),
        **config_from_metadata(found, p.name, metadata),
    }
    config = {**base, **from_file, **overrides}
    return SingleFileInfo(p, found, variant, config, scheduler, prefix)


def _read_state(info: SingleFileInfo, device: torch.device, dtype: torch.dtype | None) -> StateDict:
    """The transformer's tensors (prefix removed) on ``device`` in ``dtype``; other tensors of a full
    checkpoint (VAE, text encoders) are not read. ``dtype=None`` (CPU only): the file's own tensors,
    uncopied views of its mapping, for a PipeFusion stage that then copies just its share."""
    n = len(info.prefix)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t if dtype is None else _cast(t, dtype)

    if info.path.name.endswith(SAFETENSORS_SUFFIXES):
        from safetensors import safe_open

        with safe_open(str(info.path), framework="pt", device=str(device)) as f:
            names = [k for k in f.keys() if k.startswith(info.prefix)]  # noqa: SIM118 (not iterable)
            return {k[n:]: cast(f.get_tensor(k)) for k in names}
    tensors = _load_pickled(info.path)
    return {k[n:]: cast(v.to(device)) for k, v in tensors.items() if k.startswith(info.prefix)}


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype`` (floats only), in memory of its own: a CPU tensor read from a file is
    a view of the file's mapping, at whatever alignment the file's layout gives (kernels may round
    differently on unaligned data), and it would change with the file."""
    target = dtype if tensor.is_floating_point() else tensor.dtype
    return tensor.to(dtype=target, copy=tensor.device.type == "cpu")


def _check_leftovers(info: SingleFileInfo, leftovers: list[str]) -> None:
    if leftovers:
        shown = ", ".join(sorted(leftovers)[:5])
        log.warning(
            "%s: %d tensor(s) not used by the %s transformer: %s", info.path.name, len(leftovers), info.family, shown
        )


def _check_fits(model: nn.Module, shapes: Mapping[str, tuple[int, ...]], info: SingleFileInfo) -> None:
    """The converted tensors (name -> shape) must be exactly the model's parameters, shape for shape."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    params = {name for name, _ in model.named_parameters()}
    missing = sorted(params - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    wrong = [
        f"{k} {tuple(shapes[k])} vs {expected[k]}" for k in shapes if k in expected and tuple(shapes[k]) != expected[k]
    ]
    if missing or unexpected or wrong:
        problems = [
            f"{label}: {', '.join(items[:4])}{' ...' if len(items) > 4 else ''}"
            for label, items in (("missing", missing), ("not in the model", unexpected), ("shape", wrong))
            if items
        ]
        raise ConfigError(
            f"{info.path.name} does not fit the {info.variant} config ({'; '.join(problems)})",
            "the config is the shipped one for the variant, adapted to the sizes read from the weights; "
            "these tensors still disagree with it (a modified architecture, or a wrong variant)",
            "choose the right variant, pass config overrides for what the weights cannot show, or use a diffusers folder",
        )


def _assign(model: nn.Module, state: StateDict, info: SingleFileInfo) -> None:
    """Put the converted tensors into ``model`` (parameters on meta) after checking names and shapes."""
    _check_fits(model, {k: tuple(v.shape) for k, v in state.items()}, info)
    model.load_state_dict(state, strict=False, assign=True)


def load_single_file_transformer(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    family: str | None = None,
    variant: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    storage: str = "auto",
    dequant_dtype: str = "default",
) -> tuple[nn.Module, str, dict[str, Any]]:
    """(transformer, family, scheduler config) from one file, offline (see the module doc). A
    .safetensors file is read tensor by tensor into the model (fp8 layers as ``storage`` says, see
    ``weights.WEIGHT_STORAGE``), a .gguf file too (its Linear weights kept in their GGML blocks,
    dequantised per call with ``dequant_dtype``'s arithmetic); a .pth file is converted whole."""
    from .registry import diffusers_class, idle_weights, transformer_skeleton

    info = inspect_single_file(path, family, variant, overrides)
    cls = diffusers_class(str(info.config["_class_name"]))
    idle = idle_weights(cls)  # a class with a parallel adapter; the weights it never runs
    device = torch.device(device)
    if info.path.name.endswith(SAFETENSORS_SUFFIXES) or info.path.name.lower().endswith(GGUF_SUFFIX):
        source = _file_source(info, dequant_dtype)
        model = transformer_skeleton(cls, info.config)
        _check_fits(model, source.shapes, info)
        # the weights the adapter never runs stay on "meta", unread
        load_tensors(model, source, lambda name: None if idle(name) else "all", device, dtype, storage=storage)
        return model, info.family, dict(info.scheduler_config)
    state = _read_state(info, device, dtype)
    converted = to_diffusers(info.family, state, info.config)
    _check_leftovers(info, list(state))
    model = transformer_skeleton(cls, info.config)
    _assign(model, converted, info)
    # cast tensor by tensor: the modules diffusers keeps in float32 (Wan's rope, time embedder) stay in it
    model = cast_model(model, device, dtype).eval().requires_grad_(False)
    return model, info.family, dict(info.scheduler_config)


def load_single_file_components(
    path: str | os.PathLike,
    device: str | torch.device,
    dtype: torch.dtype,
    family: str | None = None,
    storage: str = "auto",
    dequant_dtype: str = "default",
) -> PipelineComponents:
    """A transformer-only ``PipelineComponents`` (no VAE, text encoders or tokenizers)."""
    transformer, found, scheduler = load_single_file_transformer(
        path, device, dtype, family, storage=storage, dequant_dtype=dequant_dtype
    )
    return transformer_only(path, transformer, found, scheduler)


def single_file_tensor_source(
    path: str | os.PathLike, family: str | None = None, dequant_dtype: str = "default"
) -> tuple[SingleFileInfo, type, TensorSource]:
    """(what the file holds, its diffusers transformer class, its tensors under diffusers names). A
    .safetensors or .gguf file is read only where a caller asks (a PipeFusion stage: its blocks), through the
    conversion plan (``conversion_plan``); fp8 tensors keep their dtype and per-tensor scales, GGUF ones
    their GGML type."""
    from .registry import diffusers_class

    info = inspect_single_file(path, family)
    return info, diffusers_class(str(info.config["_class_name"])), _file_source(info, dequant_dtype)


def _file_source(info: SingleFileInfo, dequant_dtype: str = "default") -> TensorSource:
    if info.path.name.lower().endswith(GGUF_SUFFIX):
        from .gguf.source import gguf_source_fields

        convert = lambda state: to_diffusers(info.family, state, info.config)  # noqa: E731
        return TensorSource(**gguf_source_fields(info, convert, dequant_dtype))
    planned = _planned_source(info) if info.path.name.endswith(SAFETENSORS_SUFFIXES) else None
    return planned or _eager_source(info)


def _eager_source(info: SingleFileInfo) -> TensorSource:
    """The whole file converted as uncopied views of its mapping (fused tensors split as views too), for
    converters that are not plain row operations, and .pth files."""
    state = _read_state(info, torch.device("cpu"), None)
    if any(t.dtype in FP8_STORAGE for t in state.values()) or any(m in k for k in state for m in _SCALED_FP8_MARKERS):
        raise ConfigError(
            f"{info.path.name} stores fp8 weights in a layout read only as a whole",
            "fp8 files are read tensor by tensor through a conversion plan, which this file's layout does not allow",
            "use the model's .safetensors release (or its bf16 file)",
        )
    converted = to_diffusers(info.family, state, info.config)
    _check_leftovers(info, list(state))
    return TensorSource(
        str(info.path.name),
        {k: v.numel() for k, v in converted.items()},
        lambda names: ((n, converted[n]) for n in names),
        shapes={k: tuple(v.shape) for k, v in converted.items()},
    )


def _planned_source(info: SingleFileInfo) -> TensorSource | None:
    """The file read through a conversion plan (None when the family's converter is not row operations)."""
    from .conversion_plan import PlanError, plan_conversion
    from .fp8 import detect_quantisation
    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(info.path)
    with file:
        quant = detect_quantisation(file.header, file.read)
        scale_of = {w: file.read(s).to(torch.float32).reshape(()) for w, s in quant.scales.items()}
    prefix = info.prefix
    shapes = {
        k[len(prefix) :]: e.shape for k, e in file.entries.items() if k.startswith(prefix) and k not in quant.extra_keys
    }
    try:
        plan = plan_conversion(lambda state: to_diffusers(info.family, state, info.config), shapes)
    except PlanError as exc:
        log.info("%s: reading the whole file (%s)", info.path.name, exc)
        return None
    _check_leftovers(info, list(plan.unused))
    fp8: dict[str, torch.dtype] = {}
    scales: dict[str, torch.Tensor] = {}
    for name in plan.pieces:
        keys = [prefix + k for k in plan.sources(name)]
        dtypes = {quant.fp8_weights.get(k) for k in keys}
        factors = {float(scale_of[k]) if k in scale_of else 1.0 for k in keys}
        if len(dtypes) == 1 and None not in dtypes and len(factors) == 1:
            fp8[name] = dtypes.pop()
            if keys[0] in scale_of:
                scales[name] = scale_of[keys[0]]

    def read(names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in names:
                whole = plan.trailing[name] is None
                parts = [
                    (key, quant.stored(key, file.read(key, None if whole else (p.r0, p.r1))))
                    for p in plan.pieces[name]
                    for key in (prefix + p.key,)
                ]
                if name not in fp8 and any(t.dtype in FP8_STORAGE for _, t in parts):  # pieces of different scales
                    parts = [(k, t.to(torch.float32) * scale_of.get(k, 1.0)) for k, t in parts]
                tensor = parts[0][1] if len(parts) == 1 else torch.cat([t for _, t in parts])
                yield name, tensor.reshape(plan.shape(name))

    shapes = {name: plan.shape(name) for name in plan.pieces}
    numels = {name: math.prod(shape) for name, shape in shapes.items()}
    return TensorSource(
        str(info.path.name),
        numels,
        read,
        fp8=fp8,
        scales=scales,
        owned=True,
        shapes=shapes,
        round_linear_to=quant.layer_dtype,  # ComfyUI's scaled-fp8 models hold every Linear in fp8
    )


def transformer_only(path, transformer: nn.Module, family: str, scheduler: dict[str, Any]) -> PipelineComponents:
    """A ``PipelineComponents`` holding just ``transformer`` (no VAE, text encoders or tokenizers)."""
    return PipelineComponents(
        path=Path(path).expanduser(),
        family=family,
        pipeline_class=family_spec(family).pipeline_class,
        model_index={},
        transformer_config=dict(transformer.config),
        scheduler_config=scheduler,
        transformer=transformer,
    )


def missing_part_error(path: str | os.PathLike, part: str) -> ConfigError:
    """The error for encoding text ("text") or decoding ("vae") with a transformer-only model."""
    name = Path(path).name
    if part == "text":
        return ConfigError(
            f"{name} holds only a transformer: it has no text encoders to encode prompts with",
            "a single diffusion-model file carries no text encoders (ComfyUI keeps them in models/text_encoders)",
            "encode the prompts with ComfyUI's own nodes (Load CLIP / DualCLIPLoader / TripleCLIPLoader, then "
            "CLIP Text Encode) and connect that CONDITIONING to the parallel sampler, or load a diffusers folder",
        )
    return ConfigError(
        f"{name} holds only a transformer: it has no VAE to decode latents with",
        "a single diffusion-model file carries no VAE (ComfyUI keeps it in models/vae)",
        "pick the model's VAE file in the Parallel Model Loader's vae input (parallel decode), or decode the "
        "LATENT with ComfyUI's Load VAE + VAE Decode nodes",
    )
