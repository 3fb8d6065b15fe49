"""What Wan takes from a ComfyUI CONDITIONING beyond text: ``WanImageToVideo``'s start image.

``concat_latent_image`` / ``concat_mask`` (the start-image latent and where it is kept) and
``clip_vision_output``'s penultimate hidden states (Wan 2.1 I2V) become the Conditioning's ``WanImageInputs``.
As in ComfyUI, a model without image K/V (``expected["image_dim"]`` None) does not use the CLIP-vision output.
Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("concat_latent_image", "concat_mask", "clip_vision_output")  # WanImageToVideo's additions


def image_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The ``WanImageInputs`` of one entry's ``options`` (None when they hold none)."""
    import torch

    from .conditioning import WanImageInputs

    out: dict[str, Any] = {}
    for key, field in (("concat_latent_image", "concat_image"), ("concat_mask", "concat_mask")):
        value = options.get(key)
        if value is not None:
            if not isinstance(value, torch.Tensor) or value.ndim != 5:
                raise ConfigError(
                    f"the {role} conditioning's {key} has shape {tuple(getattr(value, 'shape', ()))}",
                    "Wan image-to-video takes a video latent [batch, channels, frames, height, width] and its mask",
                    "use WanImageToVideo with a Wan VAE",
                )
            out[field] = value.float().cpu()
    clip = options.get("clip_vision_output")
    if clip is not None and expected.get("image_dim"):
        states = getattr(clip, "penultimate_hidden_states", None)
        if not isinstance(states, torch.Tensor) or states.shape[-1] != expected["image_dim"]:
            raise ConfigError(
                f"the {role} conditioning's clip_vision_output has no {expected['image_dim']}-wide penultimate states",
                f"Wan 2.1 image-to-video attends to CLIP ViT-H's penultimate hidden states ({expected['image_dim']} wide)",
                "encode the start image with CLIPVisionLoader (clip_vision_h) and CLIPVisionEncode",
            )
        out["image_embeds"] = states.float().cpu()
    return WanImageInputs(**out) if out else None


COMFY_CONDITIONING = ComfyConditioning(KEYS, image_inputs)
