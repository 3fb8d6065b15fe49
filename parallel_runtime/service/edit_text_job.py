"""Worker job: Qwen-Image-Edit prompts with their reference images, from ComfyUI's Qwen2.5-VL text-encoder file
(the text model as ``encode_text_file`` keeps it, the vision tower ``visual.*`` of the same file next to it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..models.base import Conditioning
from ..models.families import qwen_image
from ..models.families.qwen_image.edit_prompt import MAX_IMAGES, MODES, encode_qwen_image_edit
from ..models.families.qwen_image.vision import has_vision_tower, load_qwen25_vision_file
from ..models.families.registry import family
from ..runtime.jobs import JobContext
from .host_checks import text_encoder_files
from .load_job import TEXT_RANK, loaded_model
from .model_jobs import text_file_encoder


def check_edit_text_request(
    family_id: str, text_encoder: tuple[str, str | None] | None, images: list[Any], mode: str
) -> tuple[str, str | None]:
    """On the host: a Qwen-Image model, a Qwen2.5-VL file (with its vision tower when there are images) and its
    tokenizer, at most the images the mode takes, each a ComfyUI IMAGE; returns (file, tokenizer folder)."""
    if mode not in MODES:
        raise ConfigError(f"mode {mode!r}", f"Qwen-Image-Edit prompts are one of {MODES}", "use one of those")
    if family_id != qwen_image.ID:
        raise ConfigError(
            f"a Qwen-Image-Edit prompt for a {family_id} model",
            "the edit prompt (images in Qwen2.5-VL's prompt) conditions Qwen-Image(-Edit) transformers only",
            "load a qwen_image_edit*.safetensors with Parallel Model Loader, or use Parallel Text Encode",
        )
    if text_encoder is None:
        raise ConfigError(
            "no text-encoder file for the Qwen-Image-Edit prompt",
            "the edit prompt reads Qwen2.5-VL (text model and vision tower) from ComfyUI's text-encoder file",
            "choose qwen_2.5_vl_7b*.safetensors from models/text_encoders as text_encoder",
        )
    if len(images) > MAX_IMAGES[mode]:
        raise ConfigError(
            f"{len(images)} images for a {mode} prompt",
            f"{mode} takes at most {MAX_IMAGES[mode]}",
            "connect fewer images",
        )
    for index, image in enumerate(images):
        if image is None:
            continue
        if not isinstance(image, torch.Tensor) or image.ndim != 4 or image.shape[-1] < 3 or 0 in image.shape:
            raise ConfigError(
                f"image {index + 1} is not an IMAGE ({getattr(image, 'shape', type(image).__name__)})",
                "an IMAGE is a [batch, height, width, channels] tensor with 3 or more channels",
                "connect a Load Image or another IMAGE output",
            )
    path, tokenizer = text_encoder_files(family_id, text_encoder, None)[0]
    if any(image is not None for image in images):
        from ..models.tensor_files import SafetensorsFile

        if str(path).lower().endswith(".gguf"):
            load_qwen25_vision_file(path)  # its refusal, on the host
        if not has_vision_tower(SafetensorsFile(Path(path)).entries):
            raise ConfigError(
                f"{Path(path).name} has no vision tower (visual.*)",
                "the reference images go through Qwen2.5-VL's vision tower, which ComfyUI's own files hold",
                "choose a qwen_2.5_vl_7b*.safetensors with visual.* tensors, or leave out the images",
            )
    return path, tokenizer


def encode_edit_text_file(
    ctx: JobContext,
    encoder_path: str,
    tokenizer_dir: str | None,
    prompts: list[str],
    images: list[torch.Tensor],
    mode: str = "edit_plus",
    overrides: dict[str, Any] | None = None,
    vision_overrides: dict[str, Any] | None = None,
) -> list[Conditioning] | None:
    """Encode each prompt with ``images`` ([B, H, W, C] IMAGEs, None for an empty input; ``mode`` "edit" or "edit_plus", see
    ``qwen_image.edit_prompt``) on TEXT_RANK; the vision tower is read on the text model's device and kept."""
    model = loaded_model(ctx)
    if model.adapter.plan.family != qwen_image.ID:
        raise ConfigError(
            f"a Qwen-Image-Edit prompt with images for a {model.adapter.plan.family} model",
            "reference images ride in the prompt only for Qwen-Image(-Edit)'s Qwen2.5-VL text encoder",
            "load a Qwen-Image-Edit transformer, or encode without images",
        )
    if ctx.rank != TEXT_RANK:
        return None
    reader = family(qwen_image.ID).text_encoder_file()
    encoder, tokenizer = text_file_encoder(ctx, model, reader, encoder_path, tokenizer_dir, overrides)
    tower = None
    if any(image is not None for image in images):
        key = (encoder_path, str(vision_overrides), model.adapter.dtype)
        cached = ctx.state.get("text_file_vision")
        if cached is None or cached[0] != key:
            ctx.state.pop("text_file_vision", None)
            device = next(encoder.parameters()).device  # a spread encoder: its first layers' device
            loaded = load_qwen25_vision_file(encoder_path, device, model.adapter.dtype, overrides=vision_overrides)
            cached = (key, loaded)
            ctx.state["text_file_vision"] = cached
        tower = cached[1]
    return [
        encode_qwen_image_edit(encoder, tower, tokenizer, [p], images, mode).to("cpu", torch.float32) for p in prompts
    ]
