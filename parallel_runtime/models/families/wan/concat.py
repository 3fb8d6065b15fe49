"""The extra input channels of Wan's image-to-video and Fun-Control transformers, built from the conditioning.

A Wan transformer with more input channels than latent channels reads, after the latent, what ComfyUI's
conditioning nodes put on the CONDITIONING (each latent part in model space, the mask as ``1 - mask``):

- image-to-video (36 = 16 + 20, ``WanImageToVideo``): 4 mask channels, then the 16-channel start image;
- Wan 2.1 Fun-Control (48 = 16 + 32, ``WanFunControlToVideo``): the control video's 16 channels, then the
  start image's 16, and no mask;
- Wan 2.2 Fun-Control (52 = 16 + 36, ``Wan22FunControlToVideo``): the control video, the 4 mask channels
  (``concat_mask_index`` = 16 says where), then the start image.

Which of the two shapes applies follows from the counts (ComfyUI ``WAN21.concat_cond``): the mask goes in when
the model takes 4 channels more than the image has; only the Wan 2.1 image-to-video models (36 channels with a
CLIP-vision image embedding) and TI2V-5B also cut a wider image down to fit one. A model whose extra channels
get no image reads zeros there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ....errors import ConfigError
from ...base import LatentFormat
from ...latent_batch import repeated_to_batch
from .conditioning import WanImageInputs

MASK_CHANNELS = 4  # one per pixel frame of a latent frame (Wan's VAE packs 4 frames into one)
I2V_CHANNELS = 36  # Wan 2.1 / 2.2 image-to-video: 16 latent + 4 mask + 16 image


def cuts_image(in_channels: int, image_dim: int | None, per_frame_time: bool) -> bool:
    """ComfyUI's ``image_to_video`` models (``WAN21_I2V``: 36 channels and a CLIP-vision embedding; ``WAN22``
    TI2V-5B): a conditioning image wider than the model's image channels is cut down to them."""
    return per_frame_time or (in_channels == I2V_CHANNELS and image_dim is not None)


def takes_mask(extra: int, image_channels: int, cuts: bool, where: str = "the") -> bool:
    """Whether the ``extra`` input channels hold the mask besides an image of ``image_channels``; raises when
    the image cannot fill them."""
    with_mask = extra == image_channels + MASK_CHANNELS or (cuts and extra != image_channels)
    if (with_mask and image_channels >= extra - MASK_CHANNELS) or (not with_mask and image_channels == extra):
        return with_mask
    raise ConfigError(
        f"{where} conditioning's concat_latent_image has {image_channels} channels for a Wan model with {extra} "
        "extra input channels",
        "Wan image-to-video models take 4 mask + 16 image channels (WanImageToVideo), Wan 2.1 Fun-Control 16 "
        "control + 16 image channels (WanFunControlToVideo), Wan 2.2 Fun-Control 16 + 4 + 16 "
        "(Wan22FunControlToVideo); these do not fit",
        "use the conditioning node made for this model (or load the model the conditioning was made for)",
    )


def concat_channels(
    x: torch.Tensor,
    inputs: WanImageInputs,
    in_channels: int,
    fmt: LatentFormat,
    cuts: bool,
    pad: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``x`` [B, C, T, H, W] (possibly padded to whole tokens by ``pad``) with the model's extra input channels
    after it; the image and mask, made at the latent's own size, are padded as ``x`` was."""
    extra = in_channels - x.shape[1]
    if extra == 0:
        return x
    image = inputs.concat_image
    if image is None:
        return torch.cat([x, x.new_zeros(x.shape[0], extra, *x.shape[2:])], dim=1)
    image = fit_to_latent(pad(image.to(x.device)), x, "concat_latent_image").to(x.dtype)
    image = torch.cat([fmt.to_model(part) for part in image.split(fmt.channels, dim=1)], dim=1)
    if not takes_mask(extra, image.shape[1], cuts):
        return torch.cat([x, image], dim=1)
    image = image[:, : extra - MASK_CHANNELS]
    mask = inputs.concat_mask
    if mask is None:
        kept = x.new_zeros(x.shape[0], MASK_CHANNELS, *x.shape[2:])
    else:
        mask = mask.to(x.device, x.dtype)
        kept = 1.0 - (mask if mask.shape[1] == MASK_CHANNELS else mask.mean(dim=1, keepdim=True))
        if kept.shape[2] < x.shape[2]:  # frames the mask does not reach are not kept
            kept = nn.functional.pad(kept, (0, 0, 0, 0, 0, x.shape[2] - kept.shape[2]))
        if kept.shape[1] == 1:
            kept = kept.expand(-1, MASK_CHANNELS, -1, -1, -1)
        kept = fit_to_latent(pad(kept), x, "concat_mask")
    at = inputs.concat_mask_index
    return torch.cat([x, image[:, :at], kept, image[:, at:]], dim=1)


def fit_to_latent(t: torch.Tensor, x: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` on x's device with x's batch (a batch of 1 is repeated); its frames and size must be x's."""
    if tuple(t.shape[2:]) != tuple(x.shape[2:]):
        raise ConfigError(
            f"the conditioning's {what} is {tuple(t.shape[2:])} (frames, height, width) but the latent is "
            f"{tuple(x.shape[2:])}",
            "Wan image-to-video and Fun-Control concatenate the image latents and mask to the latent, position "
            "by position",
            "give WanImageToVideo / WanFunControlToVideo the same width, height and length as the latent you sample",
        )
    t = t.to(x.device)
    return repeated_to_batch(
        t,
        x.shape[0],
        f"the conditioning's {what}",
        "each latent needs its start image or control video (or one shared by all)",
        "use one, or as many as latents",
    )
