"""What LTX-Video takes from a ComfyUI CONDITIONING beyond text: ``LTXVConditioning``'s ``frame_rate`` (a number
on each entry; 25 when absent, ComfyUI ``model_base.LTXV.extra_conds``). ``LTXVImgToVideo``'s start image rides
on the LATENT (its noise mask), not here; guides (``LTXVAddGuide``: ``keyframe_idxs``) and conditioning denoise
masks (``concat_mask``) are refused: not supported yet.
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
                f"the {role} conditioning carries LTX-Video guide inputs ({key!r}: LTXVAddGuide)",
                "the parallel sampler runs LTX-Video text-to-video and LTXVImgToVideo; this input would be ignored",
                "start from an image with LTXVImgToVideo, or sample the guided video with ComfyUI's KSampler",
            )
    rate = options.get("frame_rate")
    if rate is None:
        return None
    return LTXFrameRate(torch.tensor([float(rate)], dtype=torch.float32))


COMFY_CONDITIONING = ComfyConditioning(KEYS, frame_rate_inputs)
