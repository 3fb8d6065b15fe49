"""What Wan adds to the shared Conditioning: the image-to-video inputs (``Conditioning.extras``)."""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras


@dataclasses.dataclass(frozen=True)
class WanImageInputs(ConditioningExtras):
    """WanImageToVideo's start image, WanFunControlToVideo's control video and start image (and reference image)
    or WanVaceToVideo's control entries, as ComfyUI's conditioning carries them (each None when absent)."""

    settings_fields = ("concat_mask_index", "vace_strength", "reference_kept")
    image_embeds: torch.Tensor | None = None  # [B, N, Di] CLIP-vision penultimate states (Wan 2.1 I2V)
    concat_image: torch.Tensor | None = None  # [B, C, T, H, W] raw image latents (ComfyUI concat_latent_image):
    # the start image (C 16), or the control video then the start image (Fun-Control, C 32)
    concat_mask: torch.Tensor | None = None  # [B, 1 or 4, T, H, W], 0 where the start image is kept (concat_mask)
    concat_mask_index: int = 0  # image channels before the mask channels (Wan22FunControlToVideo: the control's)
    # WanVaceToVideo's entries (vace.py), one per node applied, stacked on dim 1: raw latents
    vace_frames: torch.Tensor | None = None  # [B, N, 32, T, H, W] inactive then reactive control video latents
    vace_mask: torch.Tensor | None = None  # [B, N, 64, T, H, W] the mask, 8x8 pixels packed into channels
    vace_strength: tuple[float, ...] = ()  # each entry's strength
    # Wan22FunControlToVideo's ref_image (reference.py): the last reference_latents entry's first frame, raw
    reference: torch.Tensor | None = None  # [B, 16, H, W]
    # PipeFusion: a patch that reads the reference frame's kept K/V; the video's positions start one frame on
    reference_kept: bool = False

    def reference_token_count(self) -> int:
        """The reference frame's tokens (one latent frame of 2x2 patches; 0 without one)."""
        return 0 if self.reference is None else -(-self.reference.shape[-2] // 2) * -(-self.reference.shape[-1] // 2)

    def without_references(self) -> WanImageInputs:
        """These inputs for a model call whose reference tokens' K/V are kept from an earlier one (PipeFusion)."""
        return dataclasses.replace(self, reference=None, reference_kept=True)


NONE = WanImageInputs()


def image_inputs(cond: Conditioning) -> WanImageInputs:
    """The Wan inputs ``cond`` carries (all None when it carries none)."""
    extras = cond.extras
    if extras is None:
        return NONE
    if not isinstance(extras, WanImageInputs):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to a Wan model",
            "a family's extra conditioning inputs belong to that family's model",
            "encode the prompt for this Wan model (its text encoder, WanImageToVideo for a start image)",
        )
    return extras
