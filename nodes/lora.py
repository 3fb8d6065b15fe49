"""Parallel LoRA Loader: LoraLoaderModelOnly for a PARALLEL_MODEL, with strength_clip for the encoders
on the workers. Chained loaders stack in order; the base model stays loaded in its warm pool."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from parallel_runtime.service import choices as limits

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Float, Input, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import lora_choices, resolve_lora

if TYPE_CHECKING:
    from parallel_runtime.service.api import ParallelModel
    from parallel_runtime.service.lora import LoraSpec

log = logging.getLogger("dit_parallel.nodes")


@dataclasses.dataclass(frozen=True)
class LoraModifier:
    """A LoRA on a derived PARALLEL_MODEL handle (applied to the runtime model at job time)."""

    spec: LoraSpec

    def apply(self, model: ParallelModel) -> ParallelModel:
        return model.with_loras(self.spec)

    def describe(self) -> str:
        return f"LoRA {self.spec.describe()}"


def _strength(name: str, tooltip: str) -> Input:
    limit = limits.LORA_STRENGTH_LIMIT
    return Float(name, tooltip, 1.0, -limit, limit, step=0.01)


class ParallelLoraLoader(DeclaredNode):
    """Applies a LoRA file to a parallel model's weights on every worker."""

    SPEC = NodeSpec(
        node_id="DiTParallelLoraLoader",
        display_name="Parallel LoRA Loader",
        description=(
            "Like LoraLoaderModelOnly for a parallel model: every worker patches the weights it holds. Chain several "
            "to stack LoRAs. Changing the LoRA or a strength patches the loaded weights again; the model is not "
            "reloaded. Reads kohya, ComfyUI, diffusers/PEFT, AI-Toolkit, OneTrainer and XLabs files, LoKr, LoHa, "
            "DoRA and full diffs."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader (or another LoRA loader)."),
            Choice("lora_name", "A LoRA file from models/loras.", lambda: lora_choices(shared_bridge())),
            _strength("strength_model", "How strongly the LoRA changes the diffusion model (may be negative)."),
            _strength(
                "strength_clip",
                "How strongly it changes the text encoders, when Parallel Text Encode runs them on the workers "
                "(a single transformer file has none: apply the LoRA to ComfyUI's CLIP with its LoraLoader).",
            ),
        ),
        outputs=(
            Output(
                PARALLEL_MODEL, "The same model with this LoRA added to its stack (same workers).", "parallel_model"
            ),
        ),
        function="load_lora",
    )

    @classmethod
    def IS_CHANGED(cls, lora_name: str, **kwargs: Any) -> str:  # noqa: N802
        """Run again when the file changes on disk (its checks then see the new file)."""
        import os

        try:
            path = resolve_lora(lora_name, shared_bridge())
            stat = os.stat(path)
            return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
        except Exception:  # a missing file is reported by the node itself
            return lora_name

    def load_lora(
        self, parallel_model: ParallelModelHandle, lora_name: str, strength_model: float, strength_clip: float
    ) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import lora

        path = resolve_lora(lora_name, self.context.bridge)
        spec, text = lora(parallel_model.model(), path, strength_model, strength_clip)
        log.info("dit-parallel LoRA: %s", text)
        result = parallel_model if spec is None else parallel_model.derive(LoraModifier(spec))
        return {"ui": {"text": [text]}, "result": (result,)}
