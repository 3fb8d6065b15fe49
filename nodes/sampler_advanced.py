"""Parallel Sampler (Advanced): KSamplerAdvanced's inputs, run on the worker pool.

Wan 2.2 A14B's two-pass graph translates 1:1: the high-noise model's sampler runs steps 0..N with
``return_with_leftover_noise`` enabled, the low-noise model's continues N..end with ``add_noise``
disabled, each on its own PARALLEL_MODEL.
"""

from __future__ import annotations

from typing import Any

from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY
from .sampler import SEED_MAX, run_sampler, sampler_names

ENABLE_DISABLE = ("enable", "disable")
DISABLE_ENABLE = ("disable", "enable")


class ParallelSamplerAdvanced(ContextNode):
    """KSamplerAdvanced on the worker pool: a window of the schedule, with or without added noise."""

    DESCRIPTION = (
        "Like KSamplerAdvanced, but the model runs split across the worker pool: runs steps start_at_step.."
        "end_at_step of a steps-long schedule, so two models can share one schedule (Wan 2.2 A14B: high-noise "
        "then low-noise expert)."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("The latent after this window of steps (raw VAE latent, ComfyUI's convention).",)
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        samplers, schedulers = sampler_names()
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader."}),
                "add_noise": (
                    list(ENABLE_DISABLE),
                    {"tooltip": "disable for a pass that continues a latent with leftover noise."},
                ),
                "noise_seed": (
                    "INT",
                    {"default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True, "tooltip": "Noise seed."},
                ),
                "steps": ("INT", {"default": 20, "min": 1, "max": 10000, "tooltip": "Steps of the whole schedule."}),
                "cfg": (
                    "FLOAT",
                    {
                        "default": 8.0,
                        "min": 0.0,
                        "max": 100.0,
                        "step": 0.1,
                        "round": 0.01,
                        "tooltip": "Classifier-free guidance scale.",
                    },
                ),
                "sampler_name": (samplers, {"tooltip": "ComfyUI sampler."}),
                "scheduler": (schedulers, {"tooltip": "ComfyUI scheduler."}),
                "positive": ("CONDITIONING", {"tooltip": "What the video/image should show."}),
                "negative": ("CONDITIONING", {"tooltip": "What to steer away from (used when cfg > 1)."}),
                "latent_image": ("LATENT", {"tooltip": "The latent to start from."}),
                "start_at_step": (
                    "INT",
                    {"default": 0, "min": 0, "max": 10000, "tooltip": "First step this pass runs."},
                ),
                "end_at_step": (
                    "INT",
                    {"default": 10000, "min": 0, "max": 10000, "tooltip": "The pass stops at this step."},
                ),
                "return_with_leftover_noise": (
                    list(DISABLE_ENABLE),
                    {"tooltip": "enable when another pass continues this latent (it keeps its remaining noise)."},
                ),
            }
        }

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
        advanced = {
            "add_noise": add_noise != "disable",
            "start_at_step": int(start_at_step),
            "end_at_step": int(end_at_step),
            "return_with_leftover_noise": return_with_leftover_noise == "enable",
        }
        return run_sampler(
            self.context,
            parallel_model,
            positive,
            negative,
            latent_image,
            seed=int(noise_seed),
            steps=int(steps),
            cfg=float(cfg),
            sampler_name=sampler_name,
            scheduler=scheduler,
            advanced=advanced,
        )
