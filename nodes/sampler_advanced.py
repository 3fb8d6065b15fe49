"""Parallel Sampler (Advanced): KSamplerAdvanced's inputs, run on the worker pool.

Wan 2.2 A14B's two-pass graph translates 1:1: the high-noise model's sampler runs steps 0..N with
``return_with_leftover_noise`` enabled, the low-noise model's continues N..end with ``add_noise``
disabled, each on its own PARALLEL_MODEL.
"""

from __future__ import annotations

from typing import Any

from parallel_runtime.service import choices as limits

from .declare import Choice, DeclaredNode, Int, NodeSpec, Output, Socket
from .handles import ParallelModelHandle
from .sampler import MODEL_INPUT, cfg_input, run_sampler, sampler_names, scheduler_names, seed_input

ENABLE_DISABLE = list(limits.ENABLE_DISABLE)
DISABLE_ENABLE = ENABLE_DISABLE[::-1]


class ParallelSamplerAdvanced(DeclaredNode):
    """KSamplerAdvanced on the worker pool: a window of the schedule, with or without added noise."""

    SPEC = NodeSpec(
        node_id="DiTParallelSamplerAdvanced",
        display_name="Parallel Sampler (Advanced)",
        description=(
            "Like KSamplerAdvanced, but the model runs split across the worker pool: runs steps start_at_step.."
            "end_at_step of a steps-long schedule, so two models can share one schedule (Wan 2.2 A14B: high-noise "
            "then low-noise expert)."
        ),
        inputs=(
            MODEL_INPUT,
            Choice("add_noise", "disable for a pass that continues a latent with leftover noise.", ENABLE_DISABLE),
            seed_input("noise_seed"),
            Int("steps", "Steps of the whole schedule.", 20, 1, limits.MAX_STEPS),
            cfg_input(8.0, "Classifier-free guidance scale."),
            Choice("sampler_name", "ComfyUI sampler.", sampler_names),
            Choice("scheduler", "ComfyUI scheduler.", scheduler_names),
            Socket("positive", "CONDITIONING", "What the video/image should show."),
            Socket("negative", "CONDITIONING", "What to steer away from (used when cfg > 1)."),
            Socket("latent_image", "LATENT", "The latent to start from."),
            Int("start_at_step", "First step this pass runs.", 0, 0, limits.MAX_STEPS),
            Int("end_at_step", "The pass stops at this step.", limits.MAX_STEPS, 0, limits.MAX_STEPS),
            Choice(
                "return_with_leftover_noise",
                "enable when another pass continues this latent (it keeps its remaining noise).",
                DISABLE_ENABLE,
            ),
        ),
        outputs=(Output("LATENT", "The latent after this window of steps (raw VAE latent, ComfyUI's convention)."),),
        function="sample",
    )

    def sample(
        self,
        parallel_model: ParallelModelHandle,
        add_noise: str,
        noise_seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        positive: list,
        negative: list,
        latent_image: dict,
        start_at_step: int,
        end_at_step: int,
        return_with_leftover_noise: str,
    ) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import schedule_window

        advanced = schedule_window(add_noise, start_at_step, end_at_step, return_with_leftover_noise)
        return run_sampler(
            self.context,
            parallel_model,
            latent_image,
            positive=positive,
            negative=negative,
            seed=noise_seed,
            steps=steps,
            cfg=cfg,
            sampler_name=sampler_name,
            scheduler=scheduler,
            advanced=advanced,
        )
