"""Match a LoRA file's modules to a model's tensors, with counts and clear errors for bad files.

The same pure function runs on the host (the LoRA node checks a file before any sampler runs) and on
every worker (which then patches the tensors it holds), so both always agree on what a file does.
A module counts as matched when its name means a tensor of this model AND its shapes fit that tensor.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import torch

from ...errors import ConfigError
from ..families.registry import lora_markers
from .files import alphas
from .keymap import TRANSFORMER, ModelKeys, Target, alias_map
from .modules import UNSUPPORTED_KINDS, Module, Patch, group_modules, numel

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ResolvedPatch:
    """One patch of one target tensor (``module`` names it in the file)."""

    module: str
    target: Target
    patch: Patch
    scale: float  # ComfyUI's alpha / rank


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What one LoRA file does to one model."""

    patches: tuple[ResolvedPatch, ...]
    modules: int  # modules in the file
    transformer_modules: int  # matched on the transformer
    text_modules: Mapping[str, int]  # matched per text encoder component
    unmatched: tuple[str, ...]  # names that mean no tensor of this model
    wrong_shape: tuple[str, ...]  # names of this model's tensors, but other shapes
    unsupported: tuple[str, ...]  # "module (kind)" of kinds not applied
    stray_keys: tuple[str, ...]  # file keys that are no LoRA role at all

    @property
    def matched(self) -> int:
        return self.transformer_modules + sum(self.text_modules.values())

    def summary(self) -> str:
        text = ", ".join(f"{n} {c}" for c, n in sorted(self.text_modules.items()) if n)
        parts = [f"{self.transformer_modules} of {self.modules} modules patch the transformer"]
        if text:
            parts.append(f"text encoders: {text}")
        for label, items in (("unmatched", self.unmatched), ("other shapes", self.wrong_shape)):
            if items:
                parts.append(f"{len(items)} {label} (e.g. {items[0]})")
        return "; ".join(parts)


def resolve(tensors: Mapping[str, torch.Tensor], keys: ModelKeys) -> Resolution:
    """Every module of the (normalized) LoRA ``tensors`` matched to ``keys``' tensors."""
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    modules, stray = group_modules(shapes, alphas(tensors))
    aliases = alias_map(keys)
    patches: list[ResolvedPatch] = []
    unmatched, wrong, unsupported = [], [], []
    text: dict[str, int] = dict.fromkeys(keys.encoders, 0)
    on_transformer = 0
    for module in sorted(modules, key=lambda m: m.name):
        if module.unsupported:
            unsupported.append(f"{module.name} ({UNSUPPORTED_KINDS.get(module.unsupported, module.unsupported)})")
            continue
        found = aliases.get(module.name)
        if found is None:
            unmatched.append(module.name)
            continue
        fitted = _fit(module, found, shapes)
        if fitted is None:
            wrong.append(module.name)
            continue
        patches.extend(fitted)
        space = found[0].space
        if space == TRANSFORMER:
            on_transformer += 1
        else:
            text[space] += 1
    return Resolution(
        tuple(patches),
        len(modules),
        on_transformer,
        text,
        tuple(unmatched),
        tuple(wrong),
        tuple(unsupported),
        tuple(stray),
    )


def _fit(module: Module, targets: tuple[Target, Target | None], shapes: Mapping) -> list[ResolvedPatch] | None:
    weight_target, bias_target = targets
    out = []
    for patch, target in ((module.weight, weight_target), (module.bias, bias_target)):
        if patch is None:
            continue
        if target is None or not _fits(patch, target):
            return None
        out.append(ResolvedPatch(module.name, target, patch, patch.scale(shapes)))
    return out or None


def _fits(patch: Patch, target: Target) -> bool:
    if numel(patch.shape) != numel(target.shape):
        return False
    return len(target.shape) < 2 or patch.shape[0] == target.shape[0]


_UNET_MARKERS: tuple[tuple[str, str], ...] = (
    ("down_blocks", "SD 1.5 / SDXL (UNet)"),
    ("input_blocks", "SD 1.5 / SDXL (UNet)"),
)


_TEXT_PREFIXES = ("lora_te_", "lora_te1_", "lora_te2_", "lora_te3_", "lora_prior_te_", "text_encoder", "text_encoders.")


def is_text_module(name: str) -> bool:
    """Whether a module name addresses a text encoder (in any trainer's spelling)."""
    return name.startswith(_TEXT_PREFIXES)


def guess_family(names: list[str]) -> str | None:
    """Which model family a LoRA's module names suggest (for error messages only)."""
    flat = " ".join(n.replace("_", ".") for n in names)
    for marker, family in (*lora_markers(), *_UNET_MARKERS):
        if marker.replace("_", ".") in flat:
            return family
    return None


def check_resolution(resolution: Resolution, keys: ModelKeys, file_name: str, text_on_workers: bool) -> None:
    """Raise for a file that changes nothing of this model; log partial matches with counts."""
    if resolution.unsupported and not resolution.matched:
        raise ConfigError(
            f"{file_name} holds only patch kinds this loader does not apply: {', '.join(resolution.unsupported[:3])}",
            "LoRA, LoHa, LoKr, DoRA and full-diff patches are applied; GLoRA, OFT and BOFT are not (yet)",
            "use a LoRA/LoHa/LoKr version of the file, or ComfyUI's own LoRA loader on a non-parallel model",
        )
    diffusion_modules = [n for n in (*resolution.unmatched, *resolution.wrong_shape) if not is_text_module(n)]
    if resolution.matched == 0 or (resolution.transformer_modules == 0 and diffusion_modules):
        guess = guess_family(diffusion_modules or [*resolution.unmatched, *resolution.wrong_shape])
        looks = f"; its names look like a {guess} LoRA" if guess and guess != keys.family else ""
        shapes = (
            f" ({len(resolution.wrong_shape)} name this model's weights with other shapes, e.g. "
            f"{resolution.wrong_shape[0]}: made for another size of model)"
            if resolution.wrong_shape
            else ""
        )
        what = (
            f"{len(diffusion_modules)} diffusion-model modules"
            if diffusion_modules
            else f"{resolution.modules} modules"
        )
        raise ConfigError(
            f"{file_name} matches 0 of its {what} to this {keys.family} model{shapes}{looks}",
            "a LoRA patches named weights of the model it was trained for; none of these names and shapes "
            f"exist in this {keys.family} model",
            f"pick a LoRA made for {keys.family} (and this model size), or load the model the LoRA was made for",
        )
    if resolution.transformer_modules == 0 and not text_on_workers:
        raise ConfigError(
            f"{file_name} patches only text encoders, and this model's text encoders are not on the workers",
            "a single transformer file carries no text encoders: ComfyUI's own CLIP nodes encode the prompts",
            "apply the LoRA to ComfyUI's CLIP with its LoraLoader (model strength 0), or load a diffusers folder",
        )
    left = len(resolution.unmatched) + len(resolution.wrong_shape) + len(resolution.unsupported)
    if left or resolution.stray_keys:
        log.warning("%s on this %s model: %s", file_name, keys.family, resolution.summary())
