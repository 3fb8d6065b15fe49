"""Parallel HunyuanVideo 1.5 Image To Video: the empty video latent and, with a start image, the conditioning of
HunyuanVideo 1.5 image-to-video, made on the parallel workers.

It takes the inputs of the node a later ComfyUI has for this model (HunyuanVideo15ImageToVideo: positive,
negative, width, height, length, batch_size, start_image) with the Parallel Model in place of the VAE (the model's
own VAE encodes the start image on the workers) and a models/clip_vision file (or the model folder's own image
encoder) in place of the CLIP-vision output (its SigLIP tower encodes the start image on the workers), and gives the
same three outputs.
"""

from __future__ import annotations

from typing import Any

from parallel_runtime.service import choices as limits

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Int, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import clip_vision_choices, resolve_clip_vision

_VISION_TIP = (
    "The SigLIP image encoder from models/clip_vision: sigclip_vision_patch14_384.safetensors (Comfy-Org's "
    "HunyuanVideo 1.5 repackaging; the release's vision_encoder/siglip), or the model's own (an i2v diffusers "
    "folder's image_encoder). Read only when a start image is connected."
)
VISION_OWN = "(the model's own)"


def _side(name: str, default: int) -> Any:
    return Int(name, f"Video {name} in pixels (a multiple of 16).", default, 16, limits.MAX_SIDE, step=16)


class ParallelHunyuanVideo15ImageToVideo(DeclaredNode):
    """HunyuanVideo15ImageToVideo on the workers: the start image's latent and SigLIP states join both prompts."""

    SPEC = NodeSpec(
        node_id="DiTParallelHunyuanVideo15ImageToVideo",
        display_name="Parallel HunyuanVideo 1.5 Image To Video",
        description=(
            "HunyuanVideo 1.5 image-to-video inputs made on the parallel workers: the start image, resized to cover "
            "width x height and centre-cropped, encoded by the model's own VAE (the first latent frame) and by the "
            "SigLIP file (its states join the text), added to both conditionings; and the empty video latent. "
            "Without a start image: text-to-video."
        ),
        inputs=(
            Socket(
                "parallel_model", PARALLEL_MODEL, "From Parallel Model Loader (a HunyuanVideo 1.5 480p/720p i2v model)."
            ),
            Socket("positive", "CONDITIONING", "From Parallel Text Encode."),
            Socket("negative", "CONDITIONING", "From Parallel Text Encode."),
            Choice("clip_vision", _VISION_TIP, lambda: [VISION_OWN, *clip_vision_choices(shared_bridge())]),
            _side("width", 848),
            _side("height", 480),
            Int("length", "Video frames (4k+1).", 33, 1, limits.MAX_FRAMES, step=limits.FRAME_STEP),
            Int("batch_size", "Videos per run.", 1, 1, limits.MAX_BATCH),
            Socket("start_image", "IMAGE", "The video's first frame (Load Image); none: text-to-video.", optional=True),
        ),
        outputs=(
            Output("CONDITIONING", "Positive conditioning with the start image.", name="positive"),
            Output("CONDITIONING", "Negative conditioning with the start image.", name="negative"),
            Output("LATENT", "The empty video latent for Parallel Sampler.", name="latent"),
        ),
        function="encode",
    )

    def encode(
        self,
        parallel_model: ParallelModelHandle,
        positive: list,
        negative: list,
        clip_vision: str,
        width: int,
        height: int,
        length: int,
        batch_size: int,
        start_image: Any = None,
    ) -> tuple[Any, Any, dict[str, Any]]:
        from parallel_runtime.service.comfy_graph import image_to_video

        bridge = parallel_model.context.bridge
        use_file = start_image is not None and clip_vision != VISION_OWN
        vision = resolve_clip_vision(clip_vision, bridge) if use_file else None
        model = parallel_model.model()
        return image_to_video(model, positive, negative, vision, width, height, length, batch_size, start_image)
