"""HunyuanVideo 1.5's start image as HunyuanVideo15ImageToVideoPipeline makes it: the picture resized to cover the
video's size and centre-cropped (``resize_mode="crop"``, diffusers' image processor); its VAE latent (the mode of
the encoder's distribution, raw: the adapter scales it) and the SigLIP tower's last hidden states of the same
resized picture (``vision_file``). Both ride in ``GlyphText`` on every CFG branch (the pipeline conditions its
negative on the image too)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ....errors import ConfigError
from ...base import ConditioningExtras
from .conditioning import GlyphText


def _picture(image: torch.Tensor):
    """The first picture of a ComfyUI IMAGE [B, H, W, C] in 0..1 as an RGB PIL image (8 bits, as Load Image read it)."""
    from PIL import Image

    pixels = (image[0, ..., :3].float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    return Image.fromarray(np.ascontiguousarray(pixels), "RGB")


@torch.no_grad()
def encode_start_image(
    vae: Any, vision: Any, processor: Any, image: torch.Tensor, width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw start latent [1, C, 1, height/16, width/16], SigLIP states [1, N, D]) of ``image`` (a ComfyUI IMAGE)."""
    from diffusers import VaeImageProcessor

    pixels = VaeImageProcessor(vae_scale_factor=16, do_resize=False, do_convert_rgb=True)
    picture = pixels.resize(_picture(image), height=height, width=width, resize_mode="crop")
    vision_param = next(vision.parameters())
    inputs = processor.preprocess(images=picture, do_resize=True, return_tensors="pt", do_convert_rgb=True)
    states = vision(pixel_values=inputs["pixel_values"].to(vision_param.device, vision_param.dtype)).last_hidden_state
    vae_param = next(vae.parameters())
    frame = pixels.preprocess(picture, height=height, width=width).to(vae_param.device, vae_param.dtype).unsqueeze(2)
    latent = vae.encode(frame).latent_dist.mode()
    return latent.float().cpu(), states.float().cpu()


def with_start_image(extras: ConditioningExtras | None, start: torch.Tensor, embeds: torch.Tensor) -> GlyphText:
    """``extras`` (Parallel Text Encode's GlyphText for a HunyuanVideo 1.5 prompt) with the start image added."""
    if extras is None:
        extras = GlyphText()
    if not isinstance(extras, GlyphText):
        raise ConfigError(
            f"a HunyuanVideo 1.5 start image added to conditioning with {type(extras).__name__}",
            "the start image joins a HunyuanVideo 1.5 prompt's conditioning",
            "encode the prompts with Parallel Text Encode for this HunyuanVideo 1.5 model",
        )
    return dataclasses.replace(extras, start_latent=start, image_embeds=embeds)
