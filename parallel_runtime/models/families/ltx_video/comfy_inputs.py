"""What LTX-Video takes from a ComfyUI CONDITIONING beyond text: ``LTXVConditioning``'s ``frame_rate`` (a number
on each entry; 25 when absent, ComfyUI ``model_base.LTXV.extra_conds``). ``LTXVImgToVideo``'s start image
(``concat_mask`` with a noise-masked LATENT) and keyframes (``keyframe_idxs``) are refused: not supported yet.
Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("frame_rate", "concat_mask", "keyframe_idxs")


def frame_rate_inputs(options: Mapping[str, Any], expected: Mapping[str, int | None], role: str):
    """The ``LTXFrameRate`` of one entry's ``options`` (None when they hold none)."""
    import torch

    from .conditioning import LTXFrameRate

    for key in ("concat_mask", "keyframe_idxs"):
        if options.get(key) is not None:
            raise ConfigError(
                f"the {role} conditioning carries LTX-Video image-to-video inputs ({key!r})",
                "the parallel sampler runs LTX-Video text-to-video; this input would be ignored",
                "use CLIPTextEncode + LTXVConditioning with EmptyLTXVLatentVideo",
            )
    rate = options.get("frame_rate")
    if rate is None:
        return None
    return LTXFrameRate(torch.tensor([float(rate)], dtype=torch.float32))


COMFY_CONDITIONING = ComfyConditioning(KEYS, frame_rate_inputs)
