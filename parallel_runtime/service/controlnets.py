"""ControlNets of a sampling job: checked on the host before anything is sent, loaded on the workers.

Each worker keeps the ControlNets the last job used (keyed by file and the main model they sit beside) and
loads the ones a new job names; a ControlNet no job names any more is dropped.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from ..denoise.caching.specs import Caches
from ..denoise.control import ControlRunner, refuse_with_cache
from ..denoise.entries import Branch
from ..errors import ConfigError
from ..models.controlnet_files import describe_controlnet, load_controlnet
from ..models.controlnet_kind import ControlNetFile
from ..parallel.config import ParallelConfig
from ..pipefusion.controls import refuse_kind
from ..runtime.jobs import JobContext

STATE_KEY = "controlnets"


@dataclasses.dataclass(frozen=True, eq=False)
class ModelPatch:
    """A DiffSynth ControlNet model patch on a model (QwenImageDiffsynthControlnet's inputs): it acts on every
    model call of every branch, whatever the conditioning."""

    info: ControlNetFile
    image: Any  # IMAGE [B, H, W, C] as ComfyUI passes it (the first 3 channels are read)
    vae: Any  # the VAE that encodes it (ComfyUI's VAE, or anything with encode / spacial_compression_encode)
    strength: float = 1.0
    mask: Any = None  # MASK [B, H, W] (or [B, C, H, W]): the area to inpaint, for an inpainting patch

    def check_family(self, family: str) -> None:
        if self.info.family != family:
            raise ConfigError(
                f"the model patch {self.info.name} is for {self.info.family} models, this model is {family}",
                "a model patch updates the blocks of the model family it was trained with",
                f"use a model patch made for {family}",
            )

    def link(self, latent_shape: tuple[int, ...]) -> Any:
        """The patch as a chain link whose hint is the image area-scaled to the latent, encoded, in model space."""
        from ..denoise.control import ControlLink
        from .control_hint import encode_hint, kept_area

        hint = encode_hint(self.image[..., :3].movedim(-1, 1), self.vae, latent_shape, self.info.hint_format, "area")
        extra = self.info.hint_channels - hint.shape[1]
        if extra > 0:  # an inpainting patch: the area to keep beside the latent (all of it without a mask)
            hint = torch.cat([hint, kept_area(self.mask, hint.shape[0], extra, hint.shape[-2:])], dim=1)
        return ControlLink(self.info.path, hint, float(self.strength))


def patched_model(model: Any, patch: ModelPatch) -> Any:
    """``model`` (a ParallelModel: same pool, nothing reloaded) with a DiffSynth ControlNet patch after its others,
    as QwenImageDiffsynthControlnet patches a MODEL: every model call of every branch, in the order attached."""
    patch.check_family(model.family)
    view = copy.copy(model)
    view.model_patches = model.model_patches + (patch,)
    return view


def model_patch_file(path: str) -> tuple[ControlNetFile, str]:
    """Parallel Model Patch Loader: what the DiffSynth patch file at ``path`` is, and what the node shows."""
    from ..models.controlnet_kind import QWEN_DIFFSYNTH

    info = describe_controlnet(path)
    if info.kind != QWEN_DIFFSYNTH:
        raise ConfigError(
            f"{info.name} is a ControlNet file, not a model patch",
            "Parallel Model Patch Loader reads DiffSynth Qwen-Image ControlNet patches",
            "load it with Parallel ControlNet Loader and Apply ControlNet",
        )
    return info, f"{info.name}: DiffSynth ControlNet patch, {info.double_blocks} blocks"


def with_model_patches(model: Any, latent_shape: tuple[int, ...], *branches: Branch | None) -> list[Branch | None]:
    """Each branch with ``model``'s patches after every entry's ControlNets (entries sharing a chain, or none,
    keep sharing one, so they still batch as in ComfyUI)."""
    patches: tuple[ModelPatch, ...] = model.model_patches
    if not patches:
        return list(branches)
    from ..denoise.control import ControlChain

    links = tuple(p.link(latent_shape) for p in patches)
    chains: dict[int | None, ControlChain] = {}
    out: list[Branch | None] = []
    for branch in branches:
        if branch is None:
            out.append(None)
            continue
        entries = []
        for entry in branch:
            key = None if entry.control is None else entry.control.token
            if key not in chains:
                chains[key] = ControlChain((entry.control.links if entry.control is not None else ()) + links)
            entries.append(dataclasses.replace(entry, control=chains[key]))
        out.append(tuple(entries))
    return out


def control_files(*branches: Branch | None) -> tuple[str, ...]:
    """Every ControlNet file the branches' entries name, once each, in order."""
    files: dict[str, None] = {}
    for branch in branches:
        for entry in branch or ():
            if entry.control is not None:
                files.update(dict.fromkeys(entry.control.files))
    return tuple(files)


def check_controls(
    family: str,
    latent_channels: int,
    config: ParallelConfig,
    shape: tuple[int, ...],
    *branches: Branch | None,
    caches: Caches | None = None,
) -> dict[str, ControlNetFile]:
    """Each ControlNet against the model, the layout, the model's caches and the latent (what, why, fix)
    before any job."""
    infos: dict[str, ControlNetFile] = {}
    files = control_files(*branches)
    if caches is not None:
        refuse_with_cache(files, caches.step, caches.block)
    for file in files:
        info = describe_controlnet(file)
        if info.family != family:
            raise ConfigError(
                f"the ControlNet {info.name} controls {info.family} models, this model is {family}",
                "a ControlNet adds residuals to the blocks of the model family it was trained with",
                f"use a ControlNet made for {family}",
            )
        if config.pp > 1:
            refuse_kind(info.name, info.kind)
        infos[file] = info
    for branch in branches:
        for entry in branch or ():
            for link in entry.control.links if entry.control is not None else ():
                _check_link(infos[link.file], link, latent_channels, shape)
    return infos


def _check_link(info: ControlNetFile, link: Any, latent_channels: int, shape: tuple[int, ...]) -> None:
    hint, scale = link.hint, info.hint_scale
    if hint.shape[1] != info.hint_channels or tuple(hint.shape[-2:]) != (shape[-2] * scale, shape[-1] * scale):
        what = "the control image encoded at the latent's size" if scale == 1 else f"the control image at {scale}x"
        raise ConfigError(
            f"the ControlNet {info.name} got a hint of shape {list(hint.shape)} for a latent of shape {list(shape)}",
            f"the hint is {what} the latent's size, in {info.hint_channels} channels",
            "connect an RGB IMAGE (and for a ControlNet that reads latents the model's VAE) to the ControlNet apply "
            "node; the sampler scales the image to the latent",
        )
    if scale != 1 and (shape[-2] % 2 or shape[-1] % 2):
        raise ConfigError(
            f"the ControlNet {info.name} with a latent of {shape[-2]}x{shape[-1]}",
            "this ControlNet packs its image hint in 2x2 patches of the latent's size without padding (ComfyUI's "
            "fails there too)",
            "use an image size that is a multiple of 16 px",
        )
    for value in link.control_type:
        if not 0 <= value < info.union_modes:
            raise ConfigError(
                f"control type {value} for the ControlNet {info.name}, which has "
                f"{info.union_modes or 'no'} control types",
                "a union ControlNet embeds its control type; other ControlNets take none",
                "set SetUnionControlNetType to a type the file knows (or 'auto')",
            )


def loaded_controlnets(ctx: JobContext, main: Any, files: Iterable[str]) -> dict[str, ControlRunner]:
    """The runners of ``files`` on this worker beside the main adapter ``main`` (loaded when missing)."""
    cache: dict[tuple[str, int], ControlRunner] = ctx.state.setdefault(STATE_KEY, {})
    wanted = {(file, id(main)) for file in files}
    for key in [k for k in cache if k not in wanted]:
        del cache[key]
    for file, owner in wanted:
        if (file, owner) not in cache:
            cache[(file, owner)] = load_controlnet(describe_controlnet(file), main)
    return {file: cache[(file, id(main))] for file in files}
