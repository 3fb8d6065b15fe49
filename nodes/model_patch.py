"""Parallel Model Patch Loader and Parallel Qwen-Image DiffSynth ControlNet: ComfyUI's ModelPatchLoader and
QwenImageDiffsynthControlnet for a PARALLEL_MODEL.

A shared graph maps over by two swaps: ModelPatchLoader -> Parallel Model Patch Loader (same folder,
models/model_patches) and QwenImageDiffsynthControlnet -> Parallel Qwen-Image DiffSynth ControlNet (same inputs:
the model, the patch, the VAE, the image, the strength, an inpainting patch's optional mask). The VAE, image and the text stay ComfyUI's own nodes; the
workers load the patch file beside the model and apply it split like the model's tokens.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Float, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import model_patch_choices, resolve_model_patch

if TYPE_CHECKING:
    from parallel_runtime.service.api import ParallelModel

MODEL_PATCH = "MODEL_PATCH"  # ComfyUI's socket type, so graphs wire as with ModelPatchLoader


@dataclasses.dataclass(frozen=True, eq=False)
class ParallelModelPatchFile:
    """A model patch file the workers load (what Parallel Model Patch Loader hands on)."""

    info: Any  # models.controlnet_kind.ControlNetFile


@dataclasses.dataclass(frozen=True, eq=False)
class ModelPatchModifier:
    """Adds one DiffSynth ControlNet patch to the model (the DiffSynth node's handle modifier)."""

    patch: Any  # service.controlnets.ModelPatch

    def apply(self, model: ParallelModel) -> ParallelModel:
        from parallel_runtime.service.controlnets import patched_model

        return patched_model(model, self.patch)

    def describe(self) -> str:
        return f"{self.patch.info.name} x {self.patch.strength:g}"


class ParallelModelPatchLoader(DeclaredNode):
    """Names a model patch file for the worker pool (loaded there when a sampler first needs it)."""

    SPEC = NodeSpec(
        node_id="DiTParallelModelPatchLoader",
        display_name="Parallel Model Patch Loader",
        description=(
            "Like ModelPatchLoader, for a parallel model: a DiffSynth Qwen-Image ControlNet patch from "
            "models/model_patches, for Parallel Qwen-Image DiffSynth ControlNet. The workers load the file."
        ),
        inputs=(Choice("name", "A file from models/model_patches.", lambda: model_patch_choices(shared_bridge())),),
        outputs=(Output(MODEL_PATCH, "The model patch, for Parallel Qwen-Image DiffSynth ControlNet."),),
        function="load_model_patch",
    )

    def load_model_patch(self, name: str) -> dict[str, Any]:
        from parallel_runtime.service.controlnets import model_patch_file

        info, text = model_patch_file(resolve_model_patch(name, self.context.bridge))
        return {"ui": {"text": [text]}, "result": (ParallelModelPatchFile(info),)}


class ParallelQwenImageDiffsynthControlnet(DeclaredNode):
    """ComfyUI's QwenImageDiffsynthControlnet for a PARALLEL_MODEL: the same inputs, the same picture."""

    SPEC = NodeSpec(
        node_id="DiTParallelQwenImageDiffsynthControlnet",
        display_name="Parallel Qwen-Image DiffSynth ControlNet",
        description=(
            "Like QwenImageDiffsynthControlnet: the control image is area-scaled to the latent, encoded with the "
            "VAE, and the patch updates the image tokens after every block, on every model call of both branches. "
            "Chain several to apply them in order. An inpainting patch takes the optional mask (where to inpaint). "
            "Runs on the workers, split like the model (Ulysses / Ring / CFG)."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "The parallel Qwen-Image model to patch."),
            Socket("model_patch", MODEL_PATCH, "From Parallel Model Patch Loader."),
            Socket("vae", "VAE", "The model's VAE (encodes the control image)."),
            Socket("image", "IMAGE", "The control image (canny edges, depth, pose ...)."),
            Float("strength", "How strongly the patch steers the image.", 1.0, -10.0, 10.0, step=0.01),
            Socket(
                "mask",
                "MASK",
                "For an inpainting patch: where to inpaint (1), stretched to the latent; none: keep everything.",
                optional=True,
            ),
        ),
        outputs=(Output(PARALLEL_MODEL, "The same parallel model (same workers) with the patch."),),
        function="diffsynth_controlnet",
    )

    def diffsynth_controlnet(
        self,
        parallel_model: ParallelModelHandle,
        model_patch: Any,
        vae: Any,
        image: Any,
        strength: float,
        mask: Any = None,
    ) -> dict[str, Any]:
        from parallel_runtime.errors import ConfigError
        from parallel_runtime.service.controlnets import ModelPatch

        if not isinstance(model_patch, ParallelModelPatchFile):
            raise ConfigError(
                f"a model patch of {type(model_patch).__name__}",
                "the parallel model's workers load the patch from its file; ComfyUI's ModelPatchLoader keeps it in "
                "ComfyUI's process",
                "load the patch with Parallel Model Patch Loader (same file, models/model_patches)",
            )
        modifier = ModelPatchModifier(ModelPatch(model_patch.info, image, vae, float(strength), mask))
        return {"ui": {"text": [modifier.describe()]}, "result": (parallel_model.derive(modifier),)}
