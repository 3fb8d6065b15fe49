"""What HunyuanVideo takes from a ComfyUI CONDITIONING beyond text: ``HunyuanImageToVideo``'s start image.

"v1 (concat)" puts ``concat_latent_image`` / ``concat_mask`` on the positive conditioning, "v2 (replace)"
``guiding_frame_index`` (the start image itself goes on the LATENT, kept by its noise mask), "custom" ``ref_latent``;
they become the Conditioning's ``HunyuanImageInputs``. Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("concat_latent_image", "concat_mask", "guiding_frame_index", "ref_latent")


def image_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The ``HunyuanImageInputs`` of one entry's ``options`` (None when they hold none)."""
    import torch

    from .conditioning import HunyuanImageInputs

    out: dict[str, Any] = {}
    for key, field in (
        ("concat_latent_image", "concat_image"),
        ("concat_mask", "concat_mask"),
        ("ref_latent", "ref_latent"),
    ):
        value = options.get(key)
        if value is not None:
            if not isinstance(value, torch.Tensor) or value.ndim != 5:
                raise ConfigError(
                    f"the {role} conditioning's {key} has shape {tuple(getattr(value, 'shape', ()))}",
                    "HunyuanVideo image-to-video takes a video latent [batch, channels, frames, height, width] "
                    "and its mask",
                    "use HunyuanImageToVideo with the HunyuanVideo VAE",
                )
            out[field] = value.float().cpu()
    index = options.get("guiding_frame_index")
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, (int, float)):
            raise ConfigError(
                f"the {role} conditioning's guiding_frame_index is {index!r}",
                "HunyuanImageToVideo 'v2 (replace)' sets it to a number (0, the clean start frame's timestep)",
                "use HunyuanImageToVideo's output conditioning as it is",
            )
        out["guiding_timestep"] = torch.tensor([float(index)])
    return HunyuanImageInputs(**out) if out else None


COMFY_CONDITIONING = ComfyConditioning(KEYS, image_inputs)
