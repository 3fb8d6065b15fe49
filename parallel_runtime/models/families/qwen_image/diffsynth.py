"""DiffSynth Qwen-Image ControlNets ("blockwise" model patches: DiffSynth-Studio's Qwen-Image-Blockwise-ControlNet
files, ComfyUI's ModelPatchLoader + QwenImageDiffsynthControlnet), run split like the main model.

The patch has no attention of its own. Its hint is the control image VAE-encoded at the latent's size (the image
cropped about its centre to the latent's aspect and area-resized to 8x the latent), the first 16 channels put in
Qwen-Image's model space (Wan 2.1 statistics), an inpainting file's extra channel (the area to keep: one minus the
node's mask, averaged over its channels and bilinearly stretched to the latent's size; all ones when no mask is
given) appended as it is; it is packed in 2x2 patches like the latent and embedded once, ``y = img_in(hint)``.
After main block ``i`` every image token becomes ``img + strength * block_i(img, y)`` with
``block_i(x, y) = output_proj(gelu(input_proj(rms(x) * a_i + rms(y) * b_i)))`` (RMS norms with eps 1e-6): a
token-wise map, so each sp rank applies it to the image tokens it holds with its own share of ``y`` (and a
PipeFusion stage to a patch's tokens after its own blocks, ``band_updates``: ``pipefusion/controls.py``). Several
patches apply in the order they were attached, each to the image the previous one left. The patch needs a block
for every main block (DiffSynth's files have Qwen-Image's 60).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ....errors import ConfigError
from ....parallel.sharding import shard
from ...base import AttentionScope, Conditioning, ModelAdapter
from ...controlnet_kind import QWEN_DIFFSYNTH, ControlNetFile
from ...token_grid import patchify
from . import ID
from .adapter import PACK, wan21_latent_format

RMS_EPS = 1e-6
MARKER = "controlnet_blocks.0.y_rms.weight"
INPAINT_MASK_CHANNELS = 1  # an inpainting patch's hint: the latent, then the kept-area mask at the latent's size


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, RMS_EPS)


class TokenPatch:
    """One DiffSynth block's update of this rank's image tokens: ``img -> strength * block(img, y)``."""

    def __init__(self, weights: dict[str, torch.Tensor], y: torch.Tensor, strength: float):
        self.w, self.y, self.strength = weights, y, strength

    def scaled(self, factor: float) -> TokenPatch:
        return TokenPatch(self.w, self.y, self.strength * factor)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        w, y = self.w, self.y.to(img.dtype)
        h = _rms(img, w["x_rms.weight"]) + _rms(y, w["y_rms.weight"])
        h = F.gelu(F.linear(h, w["input_proj.weight"], w["input_proj.bias"]))
        return F.linear(h, w["output_proj.weight"], w["output_proj.bias"]) * self.strength


class QwenDiffSynthPatch:
    """A loaded DiffSynth model patch beside a Qwen-Image main model (``ControlRunner`` whose per-block
    results are :class:`TokenPatch` updates instead of fixed residuals)."""

    def __init__(self, state: dict[str, torch.Tensor], main: ModelAdapter):
        self.main = main
        dev, dtype = main.device, main.dtype
        self.img_in = (state["img_in.weight"].to(dev, dtype), state["img_in.bias"].to(dev, dtype))
        count = len({k.split(".")[1] for k in state if k.startswith("controlnet_blocks.")})
        # a PipeFusion stage keeps the patch blocks of the main blocks it holds (the others: None, never read)
        self.blocks: list[dict[str, torch.Tensor] | None] = [
            {
                k[len(f"controlnet_blocks.{i}.") :]: v.to(dev, dtype)
                for k, v in state.items()
                if k.startswith(f"controlnet_blocks.{i}.")
            }
            if _holds(main, i)
            else None
            for i in range(count)
        ]

    @classmethod
    def load(cls, path: str | Path, main: ModelAdapter) -> QwenDiffSynthPatch:
        from safetensors.torch import load_file

        return cls(load_file(str(path)), main)

    def layout_tag(self, control_type: Sequence[int]) -> tuple:
        return ("qwen-image-diffsynth",)

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
    ) -> list[Any]:
        """Each main block's token update for this rank's image tokens (``hint`` in model space)."""
        y = self._hint_tokens(hint, len(main_blocks), None, mesh)
        return [TokenPatch(self._block(i), y, 1.0) for i in range(len(main_blocks))]

    def band_updates(
        self,
        hint: torch.Tensor,
        control_type: Sequence[int],
        tokens: tuple[int, int],
        mesh: Any,
        blocks: Sequence[int],
        num_blocks: int,
    ) -> list[Any]:
        """PipeFusion (``pipefusion.controls.BandControl``): the token updates after the main blocks ``blocks``
        (a stage's) for this rank's share of the image tokens ``tokens``, from the band's own hint tokens."""
        y = self._hint_tokens(hint, num_blocks, tokens, mesh)
        return [TokenPatch(self._block(i), y, 1.0) for i in blocks]

    def _block(self, i: int) -> dict[str, torch.Tensor]:
        block = self.blocks[i]
        assert block is not None, f"patch block {i} belongs to another PipeFusion stage"
        return block

    def _hint_tokens(
        self, hint: torch.Tensor, num_blocks: int, band: tuple[int, int] | None, mesh: Any
    ) -> torch.Tensor:
        """``img_in`` of the hint's tokens (those of ``band`` only, when given), split over "sp" like the image's."""
        main = self.main
        if num_blocks > len(self.blocks):
            raise ConfigError(
                f"a DiffSynth ControlNet patch of {len(self.blocks)} blocks on a model of {num_blocks}",
                "the patch updates the image after every block of the model with a block of its own",
                "use the patch made for this Qwen-Image model",
            )
        hint = hint.to(main.device, main.dtype)
        if hint.ndim == 5:
            hint = hint[:, :, 0]
        hint = main.pad_to_patch(hint)
        tokens = patchify(hint, PACK, (hint.shape[-2] // PACK, hint.shape[-1] // PACK), "cpq")
        if band is not None:
            tokens = tokens[:, band[0] : band[1]]
        y = F.linear(tokens, *self.img_in)
        img_split = next(s for s in main.plan.splits if s.field == "img")
        return shard(y, img_split.dim, mesh, img_split.mesh_dim)


def _holds(main: ModelAdapter, i: int) -> bool:
    """Whether ``main`` holds block ``i``'s weights (a PipeFusion stage leaves the other stages' on "meta")."""
    if i >= main.num_blocks:
        return False
    return any(p.device.type != "meta" for p in main.block(i)[1].parameters())


def describe_diffsynth(path: Path, shapes: dict[str, list[int]]) -> ControlNetFile:
    """A DiffSynth Qwen-Image patch's facts from its tensor shapes."""
    hint_in = int(shapes["img_in.weight"][1])
    if hint_in % (PACK * PACK):
        raise ConfigError(
            f"model patch {path.name} embeds {hint_in} values per token",
            "a DiffSynth Qwen-Image ControlNet packs its hint latent in 2x2 patches (4 values per channel)",
            "use a DiffSynth Qwen-Image ControlNet file (Qwen-Image-Blockwise-ControlNet)",
        )
    channels = hint_in // (PACK * PACK)
    if channels not in (16, 16 + INPAINT_MASK_CHANNELS):
        raise ConfigError(
            f"model patch {path.name} takes {channels} hint channels",
            "a DiffSynth Qwen-Image ControlNet reads Qwen-Image's 16-channel latent, an inpainting one that latent "
            f"and {INPAINT_MASK_CHANNELS} mask channel",
            "use a DiffSynth Qwen-Image ControlNet (canny / depth / pose: 16 hint channels) or its inpainting "
            "patch (17)",
        )
    blocks = len({k.split(".")[1] for k in shapes if k.startswith("controlnet_blocks.")})
    return ControlNetFile(
        path=str(path),
        kind=QWEN_DIFFSYNTH,
        family=ID,
        union_modes=0,
        hint_channels=channels,
        double_blocks=blocks,
        single_blocks=0,
        hint_format=wan21_latent_format(16),
    )
