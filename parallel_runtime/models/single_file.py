"""Load a transformer from ONE file, as ComfyUI users keep them in ``models/diffusion_models``.

``flux1-dev.safetensors`` (Black Forest Labs' layout), ``sd3_medium.safetensors`` /
``sd3.5_medium.safetensors`` / ``sd3.5_large.safetensors`` (Stability's layout, often with a
``model.diffusion_model.`` prefix next to VAE / text-encoder tensors), PixArt ``.safetensors`` /
``.pth`` (PixArt's layout). Nothing is fetched from a hub: the family is detected from the tensor
names (``files.detect_family``), the variant from a few marker tensors, and the diffusers config
is a copy shipped in ``parallel_runtime/models/configs/<variant>/`` with everything the weights decide
(depth, width, channels, text widths, optional parts) read from the file's header. The weights
are then converted to diffusers names (``original_layout``) and assigned to a transformer built
with its parameters on the "meta" device, so no random initialisation is ever materialised.

A single file holds only the transformer: prompts are encoded and latents decoded by ComfyUI's
own text-encoder and VAE nodes (the parallel sampler takes CONDITIONING and returns a LATENT).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .files import detect_family, read_safetensors_header
from .loading import PipelineComponents
from .original_layout import ANCHOR_KEYS, CONFIG_FROM_WEIGHTS, Shapes, StateDict, detect_variant, to_diffusers
from .weights import TensorSource, parameters_on_meta

log = logging.getLogger(__name__)

SAFETENSORS_SUFFIXES: tuple[str, ...] = (".safetensors", ".sft")
SINGLE_FILE_SUFFIXES: tuple[str, ...] = (*SAFETENSORS_SUFFIXES, ".pth", ".pt")
CONFIG_ROOT = Path(__file__).resolve().parent / "configs"  # package data (pyproject: configs/**/*.json)
TRANSFORMER_PREFIX = "model.diffusion_model."  # ComfyUI / Stability full checkpoints
VARIANTS: Mapping[str, str] = MappingProxyType(
    {  # shipped config folder -> family
        "flux-dev": "flux",
        "flux-schnell": "flux",
        "sd3-medium": "sd3",
        "sd3.5-medium": "sd3",
        "sd3.5-large": "sd3",
        "pixart-sigma-1024": "pixart",
    }
)
PIPELINE_CLASSES: Mapping[str, str] = MappingProxyType(
    {
        "flux": "FluxPipeline",
        "sd3": "StableDiffusion3Pipeline",
        "pixart": "PixArtSigmaPipeline",
    }
)
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
    """(transformer config, scheduler config) shipped for ``variant``."""
    if variant not in VARIANTS:
        raise ConfigError(
            f"unknown model variant {variant!r}",
            "single files are loaded with a config shipped for each published variant",
            f"use one of {', '.join(VARIANTS)}, or leave the variant empty to detect it",
        )
    folder = CONFIG_ROOT / variant
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
            "a single-file model is one .safetensors (or PixArt .pth) transformer file",
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


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if path.name.endswith(SAFETENSORS_SUFFIXES):
        return {k: tuple(v.get("shape", ())) for k, v in read_safetensors_header(path).items()}
    return {k: tuple(v.shape) for k, v in _load_pickled(path).items()}


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
    all_shapes = _file_shapes(p)
    prefix = _transformer_prefix(all_shapes)
    shapes: Shapes = {k[len(prefix) :]: v for k, v in all_shapes.items() if k.startswith(prefix)}
    found = detect_family(shapes)
    if found is None:
        raise ConfigError(
            f"{p.name} does not look like a Flux, SD3 or PixArt transformer",
            "its tensor names match none of the supported families (is it a VAE, a text encoder or a LoRA?)",
            "use a transformer file (models/diffusion_models) of a supported family, or a diffusers folder",
        )
    if family is not None and family != found:
        raise ConfigError(
            f"{p.name} is a {found} transformer but family {family!r} was chosen",
            "the family decides the config and the conversion; a wrong one cannot load the weights",
            f"set family to {found!r} (or 'auto')",
        )
    if ANCHOR_KEYS[found] not in shapes:
        raise ConfigError(
            f"{p.name} holds a {found} transformer under diffusers' tensor names, not its original layout",
            "single files are read in the layout their authors publish (Black Forest Labs, Stability, PixArt)",
            "save it as transformer/diffusion_pytorch_model.safetensors in a diffusers folder with its config.json, "
            "or use the original single file",
        )
    if variant is None:
        variant = detect_variant(found, shapes)
    elif VARIANTS.get(variant, found) != found:
        raise ConfigError(
            f"variant {variant!r} is a {VARIANTS[variant]} model but {p.name} holds a {found} transformer",
            "the variant picks the shipped config, which must belong to the file's family",
            f"use a {found} variant ({', '.join(v for v, f in VARIANTS.items() if f == found)}) or leave it empty",
        )
    base, scheduler = shipped_config(variant)
    overrides = dict(overrides or {})
    config = {**base, **CONFIG_FROM_WEIGHTS[found](shapes, {**base, **overrides}), **overrides}
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
    if any(marker in k for k in leftovers for marker in _SCALED_FP8_MARKERS):
        raise ConfigError(
            f"{info.path.name} is a scaled-fp8 checkpoint",
            "its weights must be multiplied by per-tensor scales, which this loader does not apply",
            "use the bf16 / fp16 release of the model (or a plain fp8 file without scales)",
        )
    if leftovers:
        shown = ", ".join(sorted(leftovers)[:5])
        log.warning(
            "%s: %d tensor(s) not used by the %s transformer: %s", info.path.name, len(leftovers), info.family, shown
        )


def _assign(model: nn.Module, state: StateDict, info: SingleFileInfo) -> None:
    """Put the converted tensors into ``model`` (parameters on meta) after checking names and shapes."""
    expected = model.state_dict()
    params = {name for name, _ in model.named_parameters()}
    missing = sorted(params - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}"
        for k in state
        if k in expected and state[k].shape != expected[k].shape
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
    model.load_state_dict(state, strict=False, assign=True)


def load_single_file_transformer(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    family: str | None = None,
    variant: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, str, dict[str, Any]]:
    """(transformer, family, scheduler config) from one file, offline (see the module doc)."""
    import diffusers

    from .registry import adapter_class_for

    info = inspect_single_file(path, family, variant, overrides)
    device = torch.device(device)
    state = _read_state(info, device, dtype)
    converted = to_diffusers(info.family, state, info.config)
    _check_leftovers(info, list(state))
    cls = getattr(diffusers, str(info.config["_class_name"]))
    adapter_class_for(cls)  # a class with a parallel adapter
    with parameters_on_meta():
        model = cls.from_config(info.config)
    _assign(model, converted, info)
    # torch's own .to: diffusers' override warns about fp32-kept modules, which none of these have
    model = nn.Module.to(model, device=device, dtype=dtype).eval().requires_grad_(False)
    return model, info.family, dict(info.scheduler_config)


def load_single_file_components(
    path: str | os.PathLike,
    device: str | torch.device,
    dtype: torch.dtype,
    family: str | None = None,
) -> PipelineComponents:
    """A transformer-only ``PipelineComponents`` (no VAE, text encoders or tokenizers)."""
    transformer, found, scheduler = load_single_file_transformer(path, device, dtype, family)
    return transformer_only(path, transformer, found, scheduler)


def single_file_tensor_source(
    path: str | os.PathLike, family: str | None = None
) -> tuple[SingleFileInfo, type, TensorSource]:
    """(what the file holds, its diffusers transformer class, its tensors under diffusers names):
    the file converted as uncopied views of its mapping (fused tensors are split as views too), so a
    caller that reads only some tensors (a PipeFusion stage) copies just those."""
    import diffusers

    info = inspect_single_file(path, family)
    state = _read_state(info, torch.device("cpu"), None)
    converted = to_diffusers(info.family, state, info.config)
    _check_leftovers(info, list(state))
    source = TensorSource(
        str(info.path.name),
        {k: v.numel() for k, v in converted.items()},
        lambda names: ((n, converted[n]) for n in names),
    )
    return info, getattr(diffusers, str(info.config["_class_name"])), source


def transformer_only(path, transformer: nn.Module, family: str, scheduler: dict[str, Any]) -> PipelineComponents:
    """A ``PipelineComponents`` holding just ``transformer`` (no VAE, text encoders or tokenizers)."""
    return PipelineComponents(
        path=Path(path).expanduser(),
        family=family,
        pipeline_class=PIPELINE_CLASSES[family],
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
