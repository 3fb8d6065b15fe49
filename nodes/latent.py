"""Parallel Empty Latent: an empty LATENT with the model's channel count and a valid size."""

from __future__ import annotations

from typing import Any

from parallel_runtime.errors import ConfigError
from parallel_runtime.service import choices as limits

from .declare import DeclaredNode, Input, Int, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle


def _side(name: str, tooltip: str) -> Input:
    return Int(name, tooltip, 1024, limits.MIN_SIDE, limits.MAX_SIDE, step=limits.SIZE_STEP)


class ParallelEmptyLatent(DeclaredNode):
    """Zeros [batch, model latent channels, height/8, width/8] (video models: [batch, channels,
    (length-1)/4+1, height/f, width/f], as EmptyHunyuanLatentVideo / Wan22ImageToVideoLatent make them)."""

    SPEC = NodeSpec(
        node_id="DiTParallelEmptyLatent",
        display_name="Parallel Empty Latent",
        description=(
            "Creates an empty latent with the channel count of the parallel model (16 for Flux/SD3/Wan 2.1, 4 for "
            "PixArt, 48 for Wan 2.2 TI2V-5B); for a video model, length frames."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "Decides the latent channel count."),
            _side("width", "Image width in pixels (multiple of 8; PixArt and PipeFusion layouts need 16)."),
            _side("height", "Image height in pixels (multiple of 8; PixArt and PipeFusion layouts need 16)."),
            Int("batch_size", "Images per run.", 1, 1, limits.MAX_BATCH),
            Int(
                "length",
                "Video frames (video models; 4k+1, e.g. 81 for Wan). Image models take 1.",
                1,
                1,
                limits.MAX_FRAMES,
                step=limits.FRAME_STEP,
                optional=True,
            ),
        ),
        outputs=(Output("LATENT", "Empty latent for Parallel Sampler (denoise 1.0)."),),
        function="generate",
    )

    @classmethod
    def VALIDATE_INPUTS(cls, width: int, height: int) -> bool | str:  # noqa: N802
        """The service's size check (ComfyUI range-checks batch_size itself: it is not named here)."""
        from parallel_runtime.service.input_checks import image_size

        try:
            image_size(width, height)
        except ConfigError as exc:
            return str(exc)
        return True

    def generate(
        self, parallel_model: ParallelModelHandle, width: int, height: int, batch_size: int, length: int = 1
    ) -> tuple[dict[str, Any]]:
        from parallel_runtime.service.comfy_graph import empty_latent

        return (empty_latent(parallel_model.model(), width, height, batch_size, length),)
