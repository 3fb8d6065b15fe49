"""Parallel Model Sampling Flux / SD3 / AuraFlow: ComfyUI's ModelSamplingFlux / ModelSamplingSD3 /
ModelSamplingAuraFlow for a PARALLEL_MODEL (same inputs, defaults and math).

Each returns a new PARALLEL_MODEL on the same warm pool (nothing is reloaded) that samples with the
chosen model sampling instead of the one ComfyUI derives from the model file; the Parallel Sampler
shows which one is in force.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .handles import PARALLEL_MODEL, ParallelModelHandle
from .latent import MAX_RESOLUTION
from .loader import CATEGORY

if TYPE_CHECKING:
    from parallel_runtime.models.sampling_spec import ModelSamplingSpec
    from parallel_runtime.service.api import ParallelModel


@dataclasses.dataclass(frozen=True)
class ModelSamplingModifier:
    """Samples the model with ``spec`` (the handle modifier of the Parallel Model Sampling nodes)."""

    spec: ModelSamplingSpec

    def apply(self, model: ParallelModel) -> ParallelModel:
        return model.with_model_sampling(self.spec)

    def describe(self) -> str:
        return self.spec.describe()


def _shift(default: float, tooltip: str) -> tuple[str, dict[str, Any]]:
    return ("FLOAT", {"default": default, "min": 0.0, "max": 100.0, "step": 0.01, "tooltip": tooltip})


def _patched(handle: ParallelModelHandle, spec: ModelSamplingSpec) -> dict[str, Any]:
    return {"ui": {"text": [spec.describe()]}, "result": (handle.derive(ModelSamplingModifier(spec)),)}


class ParallelModelSamplingFlux:
    """ModelSamplingFlux for a PARALLEL_MODEL: a Flux shift from the image size."""

    DESCRIPTION = (
        "Like ModelSamplingFlux: samples the parallel model with the Flux shift of width x height "
        "(base_shift at 256 tokens, max_shift at 4096, linear between). Without it the sampler uses the "
        "model file's default, as KSampler does (Flux dev: 1.15)."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = (PARALLEL_MODEL,)
    OUTPUT_TOOLTIPS = ("The same parallel model (same workers) with this model sampling.",)
    FUNCTION = "patch"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        size = {"default": 1024, "min": 16, "max": MAX_RESOLUTION, "step": 8}
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader."}),
                "max_shift": _shift(1.15, "Shift at 4096 tokens (1024x1024)."),
                "base_shift": _shift(0.5, "Shift at 256 tokens (256x256)."),
                "width": ("INT", {**size, "tooltip": "Image width in pixels the shift is computed for."}),
                "height": ("INT", {**size, "tooltip": "Image height in pixels the shift is computed for."}),
            }
        }

    def patch(
        self, parallel_model: ParallelModelHandle, max_shift: float, base_shift: float, width: int, height: int
    ) -> dict[str, Any]:
        from parallel_runtime.denoise.model_sampling import model_sampling_flux_node

        return _patched(parallel_model, model_sampling_flux_node(max_shift, base_shift, width, height))


class ParallelModelSamplingSD3:
    """ModelSamplingSD3 for a PARALLEL_MODEL: discrete flow with a shift (timesteps = sigma x 1000)."""

    DESCRIPTION = (
        "Like ModelSamplingSD3: samples the parallel model with a discrete-flow shift (SD3's file default is 3.0)."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = (PARALLEL_MODEL,)
    OUTPUT_TOOLTIPS = ("The same parallel model (same workers) with this model sampling.",)
    FUNCTION = "patch"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader."}),
                "shift": _shift(3.0, "Higher shifts spend more steps at high noise."),
            }
        }

    def patch(self, parallel_model: ParallelModelHandle, shift: float) -> dict[str, Any]:
        from parallel_runtime.denoise.model_sampling import model_sampling_sd3_node

        return _patched(parallel_model, model_sampling_sd3_node(shift))


class ParallelModelSamplingAuraFlow(ParallelModelSamplingSD3):
    """ModelSamplingAuraFlow for a PARALLEL_MODEL: discrete flow with a shift, timesteps = sigma."""

    DESCRIPTION = "Like ModelSamplingAuraFlow: discrete-flow shift with multiplier 1 (timesteps = sigma)."

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader."}),
                "shift": _shift(1.73, "Higher shifts spend more steps at high noise."),
            }
        }

    def patch(self, parallel_model: ParallelModelHandle, shift: float) -> dict[str, Any]:
        from parallel_runtime.denoise.model_sampling import model_sampling_auraflow_node

        return _patched(parallel_model, model_sampling_auraflow_node(shift))
