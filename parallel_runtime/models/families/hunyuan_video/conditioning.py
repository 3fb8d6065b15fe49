"""What HunyuanVideo adds to the shared Conditioning: HunyuanVideo-I2V's start image (``Conditioning.extras``):
"v1 (concat)"'s latent and mask, "v2 (replace)"'s guiding frame (the start image itself is on the LATENT), or
"custom"'s reference latent."""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras
from ...latent_batch import repeated_to_batch
from ...latent_formats import LatentFormat


@dataclasses.dataclass(frozen=True)
class HunyuanImageInputs(ConditioningExtras):
    """HunyuanImageToVideo's start image, as ComfyUI's conditioning carries it."""

    concat_image: torch.Tensor | None = None  # [B, 16, T', H, W] raw start-image latent (concat_latent_image)
    concat_mask: torch.Tensor | None = None  # [B, 1, T, H, W], 0 on the frames the start image covers
    guiding_timestep: torch.Tensor | None = None  # [B] "v2 (replace)": the first frame's timestep (guiding_frame_index)
    ref_latent: torch.Tensor | None = None  # [B, 16, T', H, W] "custom": the raw start-image latent, as tokens

    def reference_token_count(self) -> int:
        """The "custom" reference's tokens (``reference_latents.reference_count``: they lengthen the sequence)."""
        if self.ref_latent is None:
            return 0
        frames, rows, cols = self.ref_latent.shape[2:]
        return frames * (rows // 2) * (cols // 2)  # HunyuanVideo's 2x2 patches

    def without_references(self) -> HunyuanImageInputs | None:
        """These inputs for a PipeFusion patch that reads the reference tokens' kept K/V: the video's positions do
        not move (the reference sits at frame -1, beside the frame), so only the reference latent goes."""
        return dataclasses.replace(self, ref_latent=None)


NONE = HunyuanImageInputs()


def image_inputs(cond: Conditioning) -> HunyuanImageInputs:
    """The start-image inputs ``cond`` carries (all None when it carries none)."""
    extras = cond.extras
    if extras is None:
        return NONE
    if not isinstance(extras, HunyuanImageInputs):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to a HunyuanVideo model",
            "a family's extra conditioning inputs belong to that family's model",
            "encode the prompt for this HunyuanVideo model (HunyuanImageToVideo for a start image)",
        )
    return extras


def start_image_channels(
    x: torch.Tensor, inputs: HunyuanImageInputs, in_channels: int, fmt: LatentFormat
) -> torch.Tensor:
    """``x`` with HunyuanVideo-I2V's extra input channels (ComfyUI ``HunyuanVideoI2V.concat_cond``): the start
    image latent in model space, zero after its frames, then ``1 - mask`` (1 where the image is kept); zeros
    without a start image. Unchanged for a text-to-video model."""
    extra = in_channels - x.shape[1]
    if extra == 0:
        if inputs.concat_image is not None:
            raise ConfigError(
                "a start image (HunyuanImageToVideo) given to a HunyuanVideo text-to-video model",
                "only HunyuanVideo-I2V (33 input channels) reads the start image's latent",
                "load the HunyuanVideo-I2V transformer, or drop the start image",
            )
        return x
    if extra != fmt.channels + 1:
        raise ConfigError(
            f"a HunyuanVideo transformer with {in_channels} input channels for a {x.shape[1]}-channel latent",
            f"HunyuanVideo-I2V takes the latent, the start image's latent ({fmt.channels}) and a mask (1)",
            "load a HunyuanVideo text-to-video or 33-channel image-to-video transformer",
        )
    image, mask = inputs.concat_image, inputs.concat_mask
    if image is None:
        image = x.new_zeros(x.shape)
    else:
        image = _fit(fmt.to_model(image.to(x.device, x.dtype)), x, "concat_latent_image")
    if mask is None:
        kept = x.new_zeros(x.shape[0], 1, *x.shape[2:])
    else:
        kept = 1.0 - _fit(mask.to(x.device, x.dtype)[:, :1].round(), x, "concat_mask")
    return torch.cat([x, image, kept], dim=1)


def _fit(t: torch.Tensor, x: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` [B', C, T', H, W] with x's batch and frames (fewer frames are padded with zeros, as ComfyUI pads)."""
    if tuple(t.shape[-2:]) != tuple(x.shape[-2:]) or t.shape[2] > x.shape[2]:
        raise ConfigError(
            f"the conditioning's {what} is {tuple(t.shape[2:])} (frames, height, width) but the latent is "
            f"{tuple(x.shape[2:])}",
            "HunyuanVideo-I2V concatenates the start image's latent and mask to the latent, position by position",
            "give HunyuanImageToVideo the same width, height and length as the latent you sample",
        )
    if t.shape[2] < x.shape[2]:
        t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, x.shape[2] - t.shape[2]))
    return repeated_to_batch(
        t,
        x.shape[0],
        f"the conditioning's {what}",
        "each latent needs its start image (or one shared by all)",
        "use one start image, or as many as latents",
    )
