"""What HunyuanVideo takes from a ComfyUI CONDITIONING beyond text: ``HunyuanImageToVideo``'s start image.

"v1 (concat)" puts ``concat_latent_image`` / ``concat_mask`` on the positive conditioning; they become the
Conditioning's ``HunyuanImageInputs``. "v2 (replace)" (``guiding_frame_index``) and "custom" (``ref_latent``)
are refused: the 16-channel token-replacing model and reference latents are not supported yet, and the node
layer would otherwise not know the keys. Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("concat_latent_image", "concat_mask", "guiding_frame_index", "ref_latent")
_REFUSED = {
    "guiding_frame_index": "HunyuanImageToVideo's 'v2 (replace)' start frame",
    "ref_latent": "HunyuanImageToVideo's 'custom' reference latent",
}


def image_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The ``HunyuanImageInputs`` of one entry's ``options`` (None when they hold none)."""
    import torch

    from .conditioning import HunyuanImageInputs

    for key, what in _REFUSED.items():
        if options.get(key) is not None:
            raise ConfigError(
                f"the {role} conditioning carries {what} ({key!r})",
                "the parallel sampler runs HunyuanVideo text-to-video and the 33-channel image-to-video model "
                "('v1 (concat)'); this input would be ignored",
                "set HunyuanImageToVideo's guidance_type to 'v1 (concat)' with the 33-channel I2V model",
            )
    out: dict[str, Any] = {}
    for key, field in (("concat_latent_image", "concat_image"), ("concat_mask", "concat_mask")):
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
    return HunyuanImageInputs(**out) if out else None


COMFY_CONDITIONING = ComfyConditioning(KEYS, image_inputs)
