"""What HunyuanVideo 1.5 adds to the shared Conditioning: the ByT5 states of the prompt's quoted (glyph) text and,
for image-to-video, the start image (its VAE latent and its SigLIP states, as HunyuanVideo15ImageToVideoPipeline
builds them)."""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras
from ...latent_formats import LatentFormat


@dataclasses.dataclass(frozen=True)
class GlyphText(ConditioningExtras):
    """ByT5's states of the quoted text of each prompt ([B, T2, D2]; T2 may be 0) and their mask ([B, T2], None
    when every prompt keeps them all); for image-to-video the start image, given to both CFG branches (the
    pipeline conditions its negative on the image too)."""

    byt5: torch.Tensor | None = None
    byt5_mask: torch.Tensor | None = None
    start_latent: torch.Tensor | None = None  # [B, C, 1, H, W] raw VAE latent (mode) of the start image
    image_embeds: torch.Tensor | None = None  # [B, N, Di] the start image's SigLIP last hidden states


def glyph_text(cond: Conditioning) -> GlyphText:
    extras = cond.extras
    if extras is None:
        return GlyphText()
    if not isinstance(extras, GlyphText):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to a HunyuanVideo 1.5 model",
            "a family's extra conditioning inputs belong to that family's model",
            "encode the prompt for this HunyuanVideo 1.5 model (Parallel Text Encode)",
        )
    return extras


def start_image_channels(x: torch.Tensor, glyph: GlyphText, in_channels: int, fmt: LatentFormat) -> torch.Tensor:
    """``x`` [B, C, T, H, W] (model space) with the transformer's condition channels (diffusers'
    ``prepare_cond_latents_and_mask``): the start image's latent in model space on the first frame, zeros after,
    then a mask that is 1 on the first frame; all zeros for text-to-video."""
    start, embeds = glyph.start_latent, glyph.image_embeds
    if (start is None) != (embeds is None):
        raise ConfigError(
            "a HunyuanVideo 1.5 start image with only its " + ("latent" if embeds is None else "SigLIP states"),
            "image-to-video conditions on both the start image's VAE latent and its SigLIP states",
            "give both GlyphText.start_latent and GlyphText.image_embeds, or neither for text-to-video",
        )
    extra = in_channels - x.shape[1]
    if extra != x.shape[1] + 1:
        raise ConfigError(
            f"a HunyuanVideo 1.5 transformer with {in_channels} input channels for a {x.shape[1]}-channel latent",
            "it takes the latent, a condition latent of as many channels and a mask channel",
            "load a HunyuanVideo 1.5 transformer with the latent's channels",
        )
    if start is None:
        return torch.cat([x, x.new_zeros(x.shape[0], extra, *x.shape[2:])], dim=1)
    b, c, _, h, w = x.shape
    if start.ndim != 5 or tuple(start.shape[1:]) != (c, 1, h, w) or b % start.shape[0]:
        raise ConfigError(
            f"a start-image latent of shape {tuple(start.shape)} for a latent of shape {tuple(x.shape)}",
            "the start image is one latent frame of the latent's channels, height and width",
            "encode the start image at the video's width and height (one frame)",
        )
    condition = x.new_zeros(b, c + 1, *x.shape[2:])
    condition[:, :c, :1] = fmt.to_model(start.to(x.device, x.dtype)).repeat(b // start.shape[0], 1, 1, 1, 1)
    condition[:, c:, :1] = 1.0
    return torch.cat([x, condition], dim=1)
