"""Qwen-Image ControlNets in the InstantX layout (diffusers' QwenImageControlNetModel file: Qwen-Image's
embedders and dual-stream blocks, ``controlnet_blocks.N`` and ``controlnet_x_embedder``), run split like the
main model.

What ComfyUI 0.3.64 computes for such a file (numbers matched, see tests/test_controlnet_qwen.py):
- the hint is the control image VAE-encoded with the model's VAE and put in Qwen-Image's model space (Wan 2.1
  latent statistics); it is packed in 2x2 patches like the noisy latent and the image tokens are
  ``img_in(x) + controlnet_x_embedder(hint)``; text and time embed as in the main model, with the same rotary
  positions (image grid centred, text after it);
- the inpainting ControlNet (a 68-value ``controlnet_x_embedder``) reads, after the hint latent's 16 channels,
  one mask channel (the host concatenates it, service/comfy_control.py), packed in the same 2x2 patches;
- after ControlNet block ``k`` its image tokens pass ``controlnet_blocks[k]``; ComfyUI spreads these over the
  60 blocks of the full-size model: each serves ``ceil(60 / ControlNet blocks)`` consecutive main blocks, and
  main block ``i`` (``i < 60``) gets ControlNet block ``i // that``, whatever the main model's depth.

A ControlNet block whose residual no main block takes is not run (its output would be discarded). On a mesh
the ControlNet's tokens are split over "sp" exactly as the main model's (the main adapter's splits), its joint
attention goes through the same sequence-parallel attention, and each rank keeps the residuals of its own
image tokens: nothing is gathered.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ....errors import ConfigError
from ....parallel.sharding import shard
from ...base import Activations, AttentionScope, Conditioning, ModelAdapter, shard_activations
from ...controlnet_kind import QWEN_INSTANTX, ControlNetFile
from ...reference_latents import references_of
from ...weights import meta_model
from . import ID
from .adapter import QwenImageAdapter, _check_mask_layout, wan21_latent_format

FULL_BLOCKS = 60  # Qwen-Image's blocks, over which ComfyUI spreads a ControlNet's residuals
INPAINT_HINT_IN = 68  # the inpainting ControlNet's hint values per token: 64 of the latent, 4 of the mask


class _ControlBlocks(QwenImageAdapter):
    """The ControlNet's Qwen-Image blocks driven like the main model's (plan, patchify, joint attention)."""


def config_from_state(state: dict[str, Any], axes_dims_rope: Sequence[int]) -> dict[str, Any]:
    """QwenImageControlNetModel's config read from a state dict's shapes (values need ``.shape`` only)."""
    pattern = re.compile(r"transformer_blocks\.(\d+)\.")
    layers = len({m.group(1) for k in state if (m := pattern.match(k))})
    inner, in_channels = state["img_in.weight"].shape
    head_dim = state["transformer_blocks.0.attn.norm_q.weight"].shape[0]
    hint_in = state["controlnet_x_embedder.weight"].shape[1]
    return {
        "patch_size": 2,
        "in_channels": int(in_channels),
        "out_channels": int(in_channels) // 4,
        "num_layers": layers,
        "attention_head_dim": int(head_dim),
        "num_attention_heads": int(inner) // int(head_dim),
        "joint_attention_dim": int(state["txt_in.weight"].shape[1]),
        "axes_dims_rope": [int(a) for a in axes_dims_rope],
        "extra_condition_channels": int(hint_in) - int(in_channels),
    }


def controlnet_blocks_used(control_blocks: int, main_blocks: int) -> int:
    """How many of the ControlNet's blocks some main block takes a residual of (ComfyUI's spread)."""
    repeat = math.ceil(FULL_BLOCKS / control_blocks)
    return min(control_blocks, math.ceil(min(main_blocks, FULL_BLOCKS) / repeat))


def spread(samples: Sequence[torch.Tensor], control_blocks: int, main_blocks: int) -> list[torch.Tensor | None]:
    """Each main block's residual: ControlNet block ``i // ceil(60 / control_blocks)`` for main block i < 60."""
    repeat = math.ceil(FULL_BLOCKS / control_blocks)
    return [
        samples[i // repeat] if i < FULL_BLOCKS and i // repeat < len(samples) else None for i in range(main_blocks)
    ]


class QwenImageControlNet:
    """A loaded InstantX Qwen-Image ControlNet beside a Qwen-Image main model (``ControlRunner``)."""

    def __init__(self, model: torch.nn.Module, main: ModelAdapter):
        self.model = model
        self.blocks = _ControlBlocks(model, main.plan.latent_format)
        self.main = main

    @classmethod
    def load(cls, path: str | Path, main: ModelAdapter) -> QwenImageControlNet:
        from safetensors.torch import load_file

        state = load_file(str(path))
        config = config_from_state(state, main.transformer.config.axes_dims_rope)
        return cls(build_model(state, config, Path(path).name, main), main)

    def layout_tag(self, control_type: Sequence[int]) -> tuple:
        return ("qwen-image-controlnet",)

    def residuals(
        self,
        x: torch.Tensor,
        timestep: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        hint: torch.Tensor,
        control_type: Sequence[int],
        mesh: Any,
        attention: AttentionScope,
        main_blocks: Sequence[str],
    ) -> list[torch.Tensor | None]:
        """Residuals of this rank's image tokens after each of ``main_blocks`` (the main model's blocks in
        execution order); ``x`` is the model input, ``timestep`` the sigma, ``hint`` the hint in model space."""
        blocks = self.blocks
        dtype, device = blocks.dtype, blocks.device
        if x.ndim == 5:
            x = x[:, :, 0]
        hint = self._hint(hint, cond, tuple(x.shape[-2:]))
        x = blocks.pad_to_patch(x.to(device, dtype))
        acts = blocks.embed_full(x, timestep.to(device), cond.to(device, dtype))
        acts = acts.replace(img=acts.img + self.model.controlnet_x_embedder(blocks.patchify(hint)))
        acts = shard_activations(acts, blocks.plan.splits, mesh)
        return self._run(acts, mesh, lambda a, k: blocks.run_block(a, k, attention), len(main_blocks))

    def band_residuals(
        self,
        x_band: torch.Tensor,
        rows: tuple[int, int],
        full_size: tuple[int, ...],
        timestep: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        hint: torch.Tensor,
        control_type: Sequence[int],
        mesh: Any,
        run_block: Callable[[ModelAdapter, Activations, int], Activations],
        main_blocks: Sequence[str],
    ) -> list[torch.Tensor | None]:
        """PipeFusion (``pipefusion.control_chain``): the residuals of this rank's share of a row band's image
        tokens after each of ``main_blocks``. ``x_band`` holds the model input's latent ``rows`` of a latent of
        ``full_size``; ``hint`` the whole hint, of which only the band's tokens are embedded; ``run_block(blocks,
        acts, k)`` runs ControlNet block ``k`` with its own attention over the band (stale K/V of the others)."""
        blocks = self.blocks
        dtype, device = blocks.dtype, blocks.device
        hint = self._hint(hint, cond, tuple(full_size[-2:]))
        acts = blocks.embed_rows(x_band, rows, full_size, timestep.to(device), cond.to(device, dtype), mesh)
        p, cols = blocks.plan.patch_size, hint.shape[-1] // blocks.plan.patch_size
        y = self.model.controlnet_x_embedder(blocks.patchify(hint)[:, rows[0] // p * cols : rows[1] // p * cols])
        img = next(s for s in blocks.plan.splits if s.field == "img")
        acts = acts.replace(img=acts.img + shard(y, img.dim, mesh, img.mesh_dim))
        return self._run(acts, mesh, lambda a, k: run_block(blocks, a, k), len(main_blocks))

    def residual_blocks(self, main_blocks: Sequence[str]) -> list[bool]:
        """Which of ``main_blocks`` get a residual (whatever the inputs)."""
        used = controlnet_blocks_used(self.blocks.num_blocks, len(main_blocks))
        return [r is not None for r in spread([True] * used, self.blocks.num_blocks, len(main_blocks))]

    def _hint(self, hint: torch.Tensor, cond: Conditioning, size: tuple[int, ...]) -> torch.Tensor:
        """The hint on the ControlNet's device, checked against the latent's ``size`` and padded to whole patches."""
        if references_of(cond, "Qwen-Image") is not None:
            raise ConfigError(
                "a Qwen-Image ControlNet together with reference images (Qwen-Image-Edit)",
                "the ControlNet's tokens are split like the image's alone; reference tokens would not line up",
                "sample reference images or a ControlNet, not both in one sampler",
            )
        hint = hint.to(self.blocks.device, self.blocks.dtype)
        if hint.ndim == 5:  # ComfyUI's [B, C, 1, H, W] image latent
            hint = hint[:, :, 0]
        if tuple(hint.shape[-2:]) != size:
            raise ConfigError(
                f"a ControlNet hint of {hint.shape[-2]}x{hint.shape[-1]} for a {size[0]}x{size[1]} latent",
                "the hint image is scaled to the latent's size and encoded with the model's VAE",
                "prepare the hint at the latent's size (the sampler node does this)",
            )
        return self.blocks.pad_to_patch(hint)

    def _run(
        self, acts: Activations, mesh: Any, step: Callable[[Activations, int], Activations], main_blocks: int
    ) -> list[torch.Tensor | None]:
        """The used ControlNet blocks in turn (``step``), each one's control block output, spread over the main
        model's ``main_blocks`` blocks."""
        _check_mask_layout(acts, mesh)
        used = controlnet_blocks_used(self.blocks.num_blocks, main_blocks)
        samples: list[torch.Tensor] = []
        for k in range(used):
            acts = step(acts, k)
            samples.append(self.model.controlnet_blocks[k](acts.img))
        return spread(samples, self.blocks.num_blocks, main_blocks)


def build_model(state: dict[str, torch.Tensor], config: dict[str, Any], name: str, main: ModelAdapter) -> Any:
    """diffusers' QwenImageControlNetModel of ``config`` holding ``state`` (its names), on the main model's
    device and dtype."""
    from diffusers import QwenImageControlNetModel

    if config["attention_head_dim"] != sum(config["axes_dims_rope"]):
        raise ConfigError(
            f"the ControlNet {name} has {config['attention_head_dim']}-wide attention heads, the "
            f"model's rotary axes cover {sum(config['axes_dims_rope'])}",
            "a Qwen-Image ControlNet runs the main model's block layout and position encoding",
            "use a ControlNet made for this Qwen-Image model",
        )
    model = meta_model(QwenImageControlNetModel, config)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(main.device, main.dtype).eval().requires_grad_(False)


def describe_qwen_instantx(path: Path, shapes: dict[str, list[int]]) -> ControlNetFile:
    """An InstantX Qwen-Image file's facts from its tensor shapes. A file whose ``controlnet_x_embedder`` reads 68
    values per token beside a 64-value ``img_in`` is the inpainting ControlNet (as ComfyUI 0.3.64 detects it): its
    hint is the 16-channel latent and one mask channel, packed 2x2 together."""
    _, in_channels = shapes["img_in.weight"]
    hint_in = shapes["controlnet_x_embedder.weight"][1]
    inpainting = hint_in == INPAINT_HINT_IN and in_channels == INPAINT_HINT_IN - 4
    if hint_in != in_channels and not inpainting:
        raise ConfigError(
            f"ControlNet file {path.name} takes {hint_in} hint values per token (the model's latent has {in_channels})",
            "a Qwen-Image ControlNet's hint is the packed latent, or for the inpainting ControlNet the 64-value "
            "latent and 4 mask values",
            "use an InstantX Qwen-Image ControlNet (Union, or Inpainting) made for this model",
        )
    latent_channels = int(in_channels) // 4
    blocks = len({k.split(".")[1] for k in shapes if k.startswith("transformer_blocks.")})
    return ControlNetFile(
        path=str(path),
        kind=QWEN_INSTANTX,
        family=ID,
        union_modes=0,
        hint_channels=int(hint_in) // 4,
        double_blocks=blocks,
        single_blocks=0,
        hint_format=wan21_latent_format(latent_channels),  # ComfyUI: latent_formats.Wan21() for these files
        mask_channels=int(hint_in) // 4 - latent_channels,
    )
