"""Parallel Model Sampling Flux / SD3 / AuraFlow: ComfyUI's ModelSamplingFlux / ModelSamplingSD3 /
ModelSamplingAuraFlow for a PARALLEL_MODEL (same inputs, defaults and math).

Each returns a new PARALLEL_MODEL on the same warm pool (nothing is reloaded) that samples with the
chosen model sampling instead of the one ComfyUI derives from the model file; the Parallel Sampler
shows which one is in force.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from parallel_runtime.service import choices as limits

from .declare import DeclaredNode, Float, Input, Int, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle

if TYPE_CHECKING:
    from parallel_runtime.service.api import ParallelModel
    from parallel_runtime.service.comfy_graph import ModelSamplingSpec


@dataclasses.dataclass(frozen=True)
class ModelSamplingModifier:
    """Samples the model with ``spec`` (the handle modifier of the Parallel Model Sampling nodes)."""

    spec: ModelSamplingSpec

    def apply(self, model: ParallelModel) -> ParallelModel:
        return model.with_model_sampling(self.spec)

    def describe(self) -> str:
        return self.spec.describe()


def _shift(name: str, default: float, tooltip: str) -> Input:
    return Float(name, tooltip, default, 0.0, limits.MAX_SHIFT, step=0.01)


def _patched(handle: ParallelModelHandle, spec: ModelSamplingSpec) -> dict[str, Any]:
    return {"ui": {"text": [spec.describe()]}, "result": (handle.derive(ModelSamplingModifier(spec)),)}


MODEL_INPUT = Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader.")
MODEL_OUTPUT = Output(PARALLEL_MODEL, "The same parallel model (same workers) with this model sampling.")
SHIFT_TOOLTIP = "Higher shifts spend more steps at high noise."


class ParallelModelSamplingFlux(DeclaredNode):
    """ModelSamplingFlux for a PARALLEL_MODEL: a Flux shift from the image size."""

    SPEC = NodeSpec(
        node_id="DiTParallelModelSamplingFlux",
        display_name="Parallel Model Sampling Flux",
        description=(
            "Like ModelSamplingFlux: samples the parallel model with the Flux shift of width x height "
            "(base_shift at 256 tokens, max_shift at 4096, linear between). Without it the sampler uses the "
            "model file's default, as KSampler does (Flux dev: 1.15)."
        ),
        inputs=(
            MODEL_INPUT,
            _shift("max_shift", 1.15, "Shift at 4096 tokens (1024x1024)."),
            _shift("base_shift", 0.5, "Shift at 256 tokens (256x256)."),
            Int(
                "width",
                "Image width in pixels the shift is computed for.",
                1024,
                limits.MIN_SIDE,
                limits.MAX_SIDE,
                step=limits.SIZE_STEP,
            ),
            Int(
                "height",
                "Image height in pixels the shift is computed for.",
                1024,
                limits.MIN_SIDE,
                limits.MAX_SIDE,
                step=limits.SIZE_STEP,
            ),
        ),
        outputs=(MODEL_OUTPUT,),
        function="patch",
    )

    def patch(
        self, parallel_model: ParallelModelHandle, max_shift: float, base_shift: float, width: int, height: int
    ) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import flux_sampling

        return _patched(parallel_model, flux_sampling(max_shift, base_shift, width, height))


class ParallelModelSamplingSD3(DeclaredNode):
    """ModelSamplingSD3 for a PARALLEL_MODEL: discrete flow with a shift (timesteps = sigma x 1000)."""

    SPEC = NodeSpec(
        node_id="DiTParallelModelSamplingSD3",
        display_name="Parallel Model Sampling SD3",
        description=(
            "Like ModelSamplingSD3: samples the parallel model with a discrete-flow shift (SD3's file default is 3.0)."
        ),
        inputs=(MODEL_INPUT, _shift("shift", 3.0, SHIFT_TOOLTIP)),
        outputs=(MODEL_OUTPUT,),
        function="patch",
    )

    def patch(self, parallel_model: ParallelModelHandle, shift: float) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import sd3_sampling

        return _patched(parallel_model, sd3_sampling(shift))


class ParallelModelSamplingAuraFlow(DeclaredNode):
    """ModelSamplingAuraFlow for a PARALLEL_MODEL: discrete flow with a shift, timesteps = sigma."""

    SPEC = NodeSpec(
        node_id="DiTParallelModelSamplingAuraFlow",
        display_name="Parallel Model Sampling AuraFlow",
        description="Like ModelSamplingAuraFlow: discrete-flow shift with multiplier 1 (timesteps = sigma).",
        inputs=(MODEL_INPUT, _shift("shift", 1.73, SHIFT_TOOLTIP)),
        outputs=(MODEL_OUTPUT,),
        function="patch",
    )

    def patch(self, parallel_model: ParallelModelHandle, shift: float) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import auraflow_sampling

        return _patched(parallel_model, auraflow_sampling(shift))
