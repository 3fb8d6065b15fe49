"""ComfyUI's CONTROL_NET for a ControlNet the workers run, and the chain a conditioning entry carries.

``ParallelControlNet`` is what ComfyUI's ``ControlNetApplyAdvanced`` and ``SetUnionControlNetType`` need of a
CONTROL_NET (``copy``, ``set_cond_hint``, ``set_previous_controlnet``, ``set_extra_arg``), so graphs wire
Parallel ControlNet Loader exactly like ComfyUI's ControlNetLoader. The weights are not loaded on the host:
the sampler reads the chain on each conditioning entry (:func:`read_control`), encodes each hint with the
VAE given to the apply node, and the workers load the file itself, beside the model they hold. Nothing here
imports ComfyUI.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..models.controlnet_files import describe_controlnet
from ..models.controlnet_kind import QWEN_INSTANTX

if TYPE_CHECKING:
    import torch

    from ..denoise.control import ControlChain
    from ..models.controlnet_kind import ControlNetFile


def controlnet(path: str) -> tuple[ParallelControlNet, str]:
    """Parallel ControlNet Loader: the CONTROL_NET for the ControlNet file at ``path`` and what the node shows."""
    info = describe_controlnet(path)
    union = f", union of {info.union_modes} types" if info.union_modes else ""
    if info.kind == QWEN_INSTANTX:  # one block list
        blocks = f"{info.double_blocks} blocks"
    else:
        blocks = f"{info.double_blocks} double + {info.single_blocks} single blocks"
    return ParallelControlNet(info), f"{info.name}: {blocks}{union}"


class ParallelControlNet:
    """A CONTROL_NET whose weights the workers load (ComfyUI's ControlNet apply nodes configure it)."""

    def __init__(self, info: ControlNetFile):
        self.info = info
        self.cond_hint_original: torch.Tensor | None = None  # [B, 3, H, W], as ControlNetApplyAdvanced passes it
        self.strength = 1.0
        self.timestep_percent_range = (0.0, 1.0)
        self.vae: Any = None
        self.previous_controlnet: Any = None
        self.extra_args: dict[str, Any] = {}
        self.latent_format = info.hint_format  # tells ComfyUI's apply node to keep the VAE it is given
        self.concat_mask = info.mask_channels > 0  # tells ControlNetInpaintingAliMamaApply to pass its mask
        self.extra_concat: tuple = ()  # the inpainting ControlNet's masks ([B, 1, H, W] each, 1 = keep)
        self._read: tuple | None = None  # (latent size, ControlChain) of the last read_control

    # -- what ComfyUI's ControlNet nodes call ------------------------------------------------------------
    def copy(self) -> ParallelControlNet:
        twin = copy.copy(self)
        twin.extra_args, twin._read = dict(self.extra_args), None
        return twin

    def set_cond_hint(
        self,
        cond_hint: Any,
        strength: float = 1.0,
        timestep_percent_range: Any = (0.0, 1.0),
        vae: Any = None,
        extra_concat: Any = (),
    ) -> ParallelControlNet:
        extra_concat = tuple(extra_concat or ())
        if extra_concat and not self.concat_mask:
            raise ConfigError(
                f"extra images concatenated to the hint of the ControlNet {self.info.name}",
                "only an inpainting ControlNet reads a mask beside its hint; this one reads the hint alone",
                "use ControlNetApplyAdvanced with this ControlNet, or load an inpainting ControlNet",
            )
        self.extra_concat = extra_concat
        self.cond_hint_original, self.strength = cond_hint, strength
        self.timestep_percent_range, self.vae = tuple(timestep_percent_range), vae
        return self

    def set_previous_controlnet(self, controlnet: Any) -> ParallelControlNet:
        self.previous_controlnet = controlnet
        return self

    def set_extra_arg(self, argument: str, value: Any = None) -> None:
        self.extra_args[argument] = value

    # -- what ComfyUI's own KSampler would call: a clear refusal -------------------------------------------
    def get_models(self) -> list:
        return []

    def get_extra_hooks(self) -> list:
        return []

    def inference_memory_requirements(self, dtype: Any) -> int:
        return 0

    def pre_run(self, model: Any, percent_to_timestep_function: Any) -> None:
        raise ConfigError(
            f"ComfyUI's sampler got the ControlNet {self.info.name} of Parallel ControlNet Loader",
            "this ControlNet runs on the worker pool, beside a PARALLEL_MODEL",
            "sample with the Parallel Sampler, or load the ControlNet with ComfyUI's Load ControlNet Model",
        )

    def cleanup(self) -> None:
        pass


def read_control(control: Any, latent_shape: tuple[int, ...] | None, where: str) -> ControlChain:
    """The chain on a conditioning entry, each hint scaled to the latent, VAE-encoded and put in model space
    (or, for a ControlNet that reads the image itself, scaled to its multiple of the latent's size)."""
    from ..denoise.control import ControlChain, ControlLink

    key = None if latent_shape is None else tuple(latent_shape[-2:])
    cached = getattr(control, "_read", None)
    if isinstance(control, ParallelControlNet) and cached is not None and cached[0] == key:
        return cached[1]  # the same CONTROL_NET on both branches: one chain (batched together, as ComfyUI does)
    links: list[ControlLink] = []
    seen: set[int] = set()
    node = control
    while node is not None:
        if id(node) in seen:
            break
        seen.add(id(node))
        if not isinstance(node, ParallelControlNet):
            raise ConfigError(
                f"the {where} conditioning carries a ControlNet of {type(node).__name__}",
                "the Parallel Sampler runs ControlNets on its workers, from their files; one loaded into ComfyUI "
                "(Load ControlNet Model) lives in ComfyUI's process",
                "load the ControlNet with Parallel ControlNet Loader (same file, same apply nodes)",
            )
        if latent_shape is None:
            raise ConfigError(
                f"the {where} conditioning carries a ControlNet but no latent size was given",
                "the hint image is scaled to the latent's size before it is encoded",
                "pass the latent shape (the sampler nodes do)",
            )
        links.append(_link(node, latent_shape, where))
        node = node.previous_controlnet
    links.reverse()  # the first applied first
    chain = ControlChain(tuple(links))
    control._read = (key, chain)  # encoded once per sampling, as ComfyUI encodes a hint once per run
    return chain


def _link(node: ParallelControlNet, latent_shape: tuple[int, ...], where: str):
    import torch

    from ..denoise.control import ControlLink
    from .control_hint import encode_hint, image_hint, inpaint_masks

    info = node.info
    if node.cond_hint_original is None:
        raise ConfigError(
            f"the ControlNet {info.name} on the {where} conditioning has no image",
            "a ControlNet follows a hint image (canny edges, depth, pose ...)",
            "apply it with ComfyUI's Apply ControlNet node and connect an IMAGE",
        )
    if info.hint_format is None:  # the image itself (an XLabs file): ComfyUI leaves the apply node's VAE unused
        hint = image_hint(node.cond_hint_original, latent_shape, info.hint_scale)
    elif node.vae is None:
        raise ConfigError(
            f"the ControlNet {info.name} on the {where} conditioning has no VAE",
            "this ControlNet reads its hint as a latent, encoded with the model's VAE (ComfyUI refuses it too)",
            "connect the model's VAE to the vae input of Apply ControlNet",
        )
    else:
        hint = encode_hint(node.cond_hint_original, node.vae, latent_shape, info.hint_format)
    if info.mask_channels:
        hint = torch.cat([hint, *inpaint_masks(node.extra_concat, hint.shape, info)], dim=1)
    start, end = node.timestep_percent_range
    control_type = tuple(int(v) for v in (node.extra_args.get("control_type") or ()))
    return ControlLink(info.path, hint, float(node.strength), float(start), float(end), control_type)
