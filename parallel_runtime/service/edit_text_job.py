"""Worker job: Qwen-Image-Edit prompts with their reference images, from ComfyUI's Qwen2.5-VL text-encoder file
(the text model as ``encode_text_file`` keeps it, the vision tower ``visual.*`` of the same file next to it)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError
from ..models.base import Conditioning
from ..models.families import qwen_image
from ..models.families.qwen_image.edit_prompt import encode_qwen_image_edit
from ..models.families.qwen_image.vision import load_qwen25_vision_file
from ..models.families.registry import family
from ..runtime.jobs import JobContext
from .load_job import TEXT_RANK, loaded_model
from .model_jobs import text_file_encoder


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
    """Encode each prompt with ``images`` ([1, H, W, C] IMAGEs; ``mode`` "edit" or "edit_plus", see
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
    if images:
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
