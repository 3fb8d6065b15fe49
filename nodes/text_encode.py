"""Parallel Text Encode: the loaded pipeline's own text encoders, or a text-encoder file -> ComfyUI CONDITIONING."""

from __future__ import annotations

from typing import Any

from .bridge import ComfyBridge
from .conditioning import from_runtime
from .context import NodeContext
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY
from .model_files import TEXT_ENCODER_OWN, resolve_text_encoder, text_encoder_choices


class ParallelTextEncode:
    """Encodes a prompt with the text encoders that came with the parallel model."""

    DESCRIPTION = (
        "Encodes a prompt into ComfyUI conditioning with the model's own text encoders (CLIP / T5 / Qwen2.5-VL / "
        "Mistral of a diffusers folder), or with a text-encoder file (Qwen-Image's Qwen2.5-VL, bf16 or fp8)."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("CONDITIONING",)
    OUTPUT_TOOLTIPS = ("Text conditioning for Parallel Sampler (or any node that takes CONDITIONING).",)
    FUNCTION = "encode"

    def __init__(self, context: NodeContext | None = None):
        self._context = context

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader."}),
                "text": ("STRING", {"multiline": True, "dynamicPrompts": True, "tooltip": "The prompt."}),
            },
            "optional": {
                "text_encoder": (
                    text_encoder_choices(ComfyBridge()),
                    {
                        "default": TEXT_ENCODER_OWN,
                        "tooltip": "The model's own encoders (a diffusers folder's), or a file from "
                        "models/text_encoders or models/clip (qwen_2.5_vl_7b*.safetensors, or a Qwen2.5-VL GGUF "
                        "as ComfyUI-GGUF's CLIPLoaderGGUF reads it, for a Qwen-Image transformer file).",
                    },
                ),
            },
        }

    def encode(
        self, parallel_model: ParallelModelHandle, text: str, text_encoder: str = TEXT_ENCODER_OWN
    ) -> tuple[list]:
        model = parallel_model.model()
        chosen = resolve_text_encoder(text_encoder, parallel_model.context.bridge)
        cond = model.encode_text(text) if chosen is None else model.encode_text(text, chosen)
        return (from_runtime(cond),)
