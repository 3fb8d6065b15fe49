"""Parallel Runtime Unload: stop the worker processes and free their GPUs."""

from __future__ import annotations

from typing import Any

from .declare import DeclaredNode, NodeSpec, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle


class ParallelRuntimeUnload(DeclaredNode):
    """Frees the workers (one model's, or all). ComfyUI's "Unload models" button does the same."""

    SPEC = NodeSpec(
        node_id="DiTParallelUnload",
        display_name="Parallel Runtime Unload",
        description=(
            "Stops the worker processes and frees their GPU memory: the connected model's pool, or every pool when "
            "nothing is connected. A later run starts the workers again."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "Unload only this model's workers (else all).", True),
            Socket("after", "*", "Anything: connect an output here to unload after that node ran.", True),
        ),
        outputs=(),
        function="unload",
        output_node=True,
    )

    @classmethod
    def VALIDATE_INPUTS(cls, input_types: dict[str, str]) -> bool:  # noqa: N802
        return True  # "after" accepts any type

    @classmethod
    def IS_CHANGED(cls, **kwargs: Any) -> float:  # noqa: N802
        return float("nan")  # always run: unloading is an action, not a cached result

    def unload(self, parallel_model: ParallelModelHandle | None = None, after: Any = None) -> dict[str, Any]:
        if parallel_model is not None:
            parallel_model.unload()
            text = f"unloaded {parallel_model!r}"
        else:
            self.context.unload_all()
            text = "unloaded every DiT Parallel worker pool"
        return {"ui": {"text": [text]}}
