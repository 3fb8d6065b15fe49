"""Parallel Text Encode: the loaded pipeline's own text encoders -> ComfyUI CONDITIONING."""

from __future__ import annotations

from typing import Any

from .conditioning import from_runtime
from .context import NodeContext
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY


class ParallelTextEncode:
    """Encodes a prompt with the text encoders that came with the parallel model."""

    DESCRIPTION = "Encodes a prompt with the model's own text encoders (CLIP / T5) into ComfyUI conditioning."
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
            }
        }

    def encode(self, parallel_model: ParallelModelHandle, text: str) -> tuple[list]:
        model = parallel_model.model()
        return (from_runtime(model.encode_text(text)),)
