"""Parallel Runtime Unload: stop the worker processes and free their GPUs."""

from __future__ import annotations

from typing import Any

from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY


class ParallelRuntimeUnload(ContextNode):
    """Frees the workers (one model's, or all). ComfyUI's "Unload models" button does the same."""

    DESCRIPTION = (
        "Stops the worker processes and frees their GPU memory: the connected model's pool, or every pool when "
        "nothing is connected. A later run starts the workers again."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "unload"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "optional": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "Unload only this model's workers (else all)."}),
                "after": ("*", {"tooltip": "Anything: connect an output here to unload after that node ran."}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, input_types: dict[str, str]) -> bool:
        return True  # "after" accepts any type

    def unload(self, parallel_model: ParallelModelHandle | None = None, after: Any = None) -> dict[str, Any]:
        if parallel_model is not None:
            parallel_model.unload()
            text = f"unloaded {parallel_model!r}"
        else:
            self.context.unload_all()
            text = "unloaded every DiT Parallel worker pool"
        return {"ui": {"text": [text]}}

    @classmethod
    def IS_CHANGED(cls, **kwargs: Any) -> float:
        return float("nan")  # always run: unloading is an action, not a cached result
