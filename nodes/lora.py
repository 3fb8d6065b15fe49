"""Parallel LoRA Loader: LoraLoaderModelOnly for a PARALLEL_MODEL, with strength_clip for the encoders
on the workers. Chained loaders stack in order; the base model stays loaded in its warm pool."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from .bridge import ComfyBridge
from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY
from .model_files import lora_choices, resolve_lora

if TYPE_CHECKING:
    from parallel_runtime.service.api import ParallelModel
    from parallel_runtime.service.lora import LoraSpec

log = logging.getLogger("dit_parallel.nodes")
STRENGTH_LIMIT = 100.0


@dataclasses.dataclass(frozen=True)
class LoraModifier:
    """A LoRA on a derived PARALLEL_MODEL handle (applied to the runtime model at job time)."""

    spec: LoraSpec

    def apply(self, model: ParallelModel) -> ParallelModel:
        return model.with_loras(self.spec)

    def describe(self) -> str:
        return f"LoRA {self.spec.describe()}"


def _strength(tooltip: str) -> tuple[str, dict[str, Any]]:
    limit = STRENGTH_LIMIT
    return ("FLOAT", {"default": 1.0, "min": -limit, "max": limit, "step": 0.01, "tooltip": tooltip})


class ParallelLoraLoader(ContextNode):
    """Applies a LoRA file to a parallel model's weights on every worker."""

    DESCRIPTION = (
        "Like LoraLoaderModelOnly for a parallel model: every worker patches the weights it holds. Chain several to "
        "stack LoRAs. Changing the LoRA or a strength patches the loaded weights again; the model is not reloaded. "
        "Reads kohya, ComfyUI, diffusers/PEFT, AI-Toolkit, OneTrainer and XLabs files, LoKr, LoHa, DoRA and full diffs."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = (PARALLEL_MODEL,)
    RETURN_NAMES = ("parallel_model",)
    OUTPUT_TOOLTIPS = ("The same model with this LoRA added to its stack (same workers).",)
    FUNCTION = "load_lora"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader (or another LoRA loader)."}),
                "lora_name": (lora_choices(ComfyBridge()), {"tooltip": "A LoRA file from models/loras."}),
                "strength_model": _strength("How strongly the LoRA changes the diffusion model (may be negative)."),
                "strength_clip": _strength(
                    "How strongly it changes the text encoders, when Parallel Text Encode runs them on the workers "
                    "(a single transformer file has none: apply the LoRA to ComfyUI's CLIP with its LoraLoader)."
                ),
            }
        }

    @classmethod
    def IS_CHANGED(cls, lora_name: str, **kwargs: Any) -> str:
        """Run again when the file changes on disk (its checks then see the new file)."""
        import os

        try:
            path = resolve_lora(lora_name, ComfyBridge())
            stat = os.stat(path)
            return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
        except Exception:  # a missing file is reported by the node itself
            return lora_name

    def load_lora(
        self, parallel_model: ParallelModelHandle, lora_name: str, strength_model: float, strength_clip: float
    ) -> dict[str, Any]:
        from parallel_runtime.service.lora import LoraSpec

        if strength_model == 0 and strength_clip == 0:
            return {"ui": {"text": [f"{lora_name}: strength 0, not applied"]}, "result": (parallel_model,)}
        spec = LoraSpec.of(resolve_lora(lora_name, self.context.bridge), strength_model, strength_clip)
        model = parallel_model.model()  # the warm pool; its key table comes with the loaded model
        resolution = model.lora_checks.check(spec, model.lora_keys)  # the API's own check (with_loras)
        text = f"{spec.describe()}: {resolution.summary()}"
        log.info("dit-parallel LoRA: %s", text)
        return {"ui": {"text": [text]}, "result": (parallel_model.derive(LoraModifier(spec)),)}
