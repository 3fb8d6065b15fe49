"""Worker job: a video's start image for HunyuanVideo 1.5 image-to-video, made on the workers: its latent through
the loaded model's own VAE and its SigLIP states from a vision-encoder file of ComfyUI's ``models/clip_vision``
(``families.hunyuan_video15.start_image``); the host checks the request first."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import ConfigError
from ..models.families import hunyuan_video15
from ..runtime.jobs import JobContext
from .load_job import TEXT_RANK, loaded_model


def check_start_image_request(family_id: str, vision_path: str | None, image: object, model_path: Path) -> None:
    """On the host: a HunyuanVideo 1.5 model, a SigLIP file (None: the model folder's own image encoder), an IMAGE."""
    from ..models.families.hunyuan_video15.vision_file import check_folder_encoder, siglip_config

    if family_id != hunyuan_video15.ID:
        raise ConfigError(
            f"a HunyuanVideo 1.5 start image for a {family_id} model",
            "the start image's latent and SigLIP states condition HunyuanVideo 1.5 transformers only",
            "load a HunyuanVideo 1.5 model with Parallel Model Loader, or use the start-image node of your model",
        )
    if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] < 3 or 0 in image.shape:
        raise ConfigError(
            f"start_image is not an IMAGE ({getattr(image, 'shape', type(image).__name__)})",
            "an IMAGE is a [batch, height, width, channels] tensor with 3 or more channels",
            "connect a Load Image or another IMAGE output",
        )
    if vision_path is None:
        check_folder_encoder(model_path)
    else:
        siglip_config(vision_path)


def encode_start_image(
    ctx: JobContext, vision_path: str | None, image: torch.Tensor, width: int, height: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(raw start latent [1, C, 1, h, w], SigLIP states [1, N, D]) on TEXT_RANK (None on the others), SigLIP from
    ``vision_path`` or (None) the model folder's own image encoder; the tower is kept for the next image."""
    from ..models.families.hunyuan_video15.start_image import encode_start_image as encode
    from ..models.families.hunyuan_video15.vision_file import load_folder_encoder, load_siglip_file
    from ..models.single_file import missing_part_error

    model = loaded_model(ctx)
    if model.adapter.plan.family != hunyuan_video15.ID:
        raise ConfigError(
            f"a HunyuanVideo 1.5 start image for a {model.adapter.plan.family} model",
            "the start image conditions HunyuanVideo 1.5 transformers only",
            "load a HunyuanVideo 1.5 model",
        )
    if ctx.rank != TEXT_RANK:
        return None
    if model.components.vae is None:  # a transformer file loaded without a VAE
        raise missing_part_error(model.components.path, "vae")
    source = Path(vision_path or model.components.path).resolve()
    key, dtype = (str(source), model.adapter.dtype), model.adapter.dtype
    cached = ctx.state.get("start_image_vision")
    if cached is None or cached[0] != key:
        ctx.state.pop("start_image_vision", None)
        load = load_siglip_file if vision_path else load_folder_encoder
        cached = (key, load(str(source), ctx.device, dtype))
        ctx.state["start_image_vision"] = cached
    vision, processor = cached[1]
    return encode(model.components.vae, vision, processor, image, width, height)
