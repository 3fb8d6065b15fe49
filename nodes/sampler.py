"""Parallel Sampler: KSampler's inputs, run on the worker pool, with progress, previews and cancel."""

from __future__ import annotations

import logging
from typing import Any

from parallel_runtime.errors import ConfigError, JobCancelled

from .conditioning import to_runtime
from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .latent import SIZE_STEP
from .loader import CATEGORY
from .progress import JobMonitor, run_with_events

log = logging.getLogger("dit_parallel.nodes")
SEED_MAX = 0xFFFFFFFFFFFFFFFF


def sampler_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from parallel_runtime.sampling import SAMPLER_NAMES, SCHEDULER_NAMES

    return tuple(SAMPLER_NAMES), tuple(SCHEDULER_NAMES)


def prepare_latent(latent: Any, channels: int, family: str, spatial: int = 8, frame_axis: bool = False) -> Any:
    """The LATENT's samples as float32 [B,C,H,W], checked against the model (``spatial`` image pixels per
    latent pixel; ``frame_axis``: the family's LATENT may be [B,C,1,H,W], as ComfyUI keeps Qwen-Image's).

    An all-zero latent with another channel count (ComfyUI's EmptyLatentImage is 4-channel) is
    replaced by zeros with the model's channels, as ComfyUI's own KSampler does."""
    import torch

    if not isinstance(latent, dict) or not isinstance(latent.get("samples"), torch.Tensor):
        raise ConfigError(
            "latent_image is not a LATENT",
            "a LATENT is a dict with a 'samples' tensor",
            "connect Parallel Empty Latent, EmptySD3LatentImage, VAEEncode or another LATENT output",
        )
    if latent.get("noise_mask") is not None:
        raise ConfigError(
            "latent_image carries a noise mask (inpainting)",
            "the parallel sampler denoises the whole latent; it would ignore the mask",
            "remove Set Latent Noise Mask / VAE Encode (for Inpainting), or use ComfyUI's KSampler for inpainting",
        )
    samples = latent["samples"]
    if frame_axis and samples.ndim == 5 and samples.shape[2] == 1:
        samples = samples[:, :, 0]
    if samples.ndim != 4:
        raise ConfigError(
            f"latent_image has shape {tuple(samples.shape)}",
            "image models take latents [batch, channels, height, width] (video latents are 5-D)",
            "use an image latent",
        )
    b, c, h, w = samples.shape
    if c != channels:
        if not torch.any(samples):
            log.info("empty %d-channel latent replaced by an empty %d-channel latent for %s", c, channels, family)
            samples = torch.zeros(b, channels, h, w)
        else:
            raise ConfigError(
                f"latent_image has {c} channels but this {family} model works with {channels}",
                "a latent is only meaningful to the VAE (and model) that made it",
                "encode the image with this model's VAE (16 channels for Flux/SD3, 4 for PixArt)",
            )
    width, height = w * spatial, h * spatial
    if width % SIZE_STEP or height % SIZE_STEP:
        raise ConfigError(
            f"the latent is {width}x{height} pixels; width and height must be multiples of {SIZE_STEP}",
            "the transformer packs 2x2 latent pixels (16x16 image pixels) into one token",
            f"resize to {width // SIZE_STEP * SIZE_STEP}x{height // SIZE_STEP * SIZE_STEP} "
            "(e.g. with Upscale Latent or ImageScale before VAE Encode)",
        )
    return samples.float().cpu()


class ParallelSampler(ContextNode):
    """Denoises a LATENT on the worker pool with ComfyUI's sampler and scheduler math."""

    DESCRIPTION = (
        "Like KSampler, but the model runs split across the worker pool. Takes CONDITIONING from Parallel Text "
        "Encode or ComfyUI's own text encoders when the shapes fit the model."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("LATENT",)
    OUTPUT_TOOLTIPS = ("The denoised latent (raw VAE latent, ComfyUI's convention).",)
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        samplers, schedulers = sampler_names()
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader."}),
                "positive": ("CONDITIONING", {"tooltip": "What the image should show."}),
                "negative": ("CONDITIONING", {"tooltip": "What to steer away from (used when cfg > 1)."}),
                "latent_image": (
                    "LATENT",
                    {"tooltip": "Empty latent (text to image) or an encoded image (denoise < 1)."},
                ),
                "seed": (
                    "INT",
                    {"default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True, "tooltip": "Noise seed."},
                ),
                "steps": ("INT", {"default": 20, "min": 1, "max": 10000, "tooltip": "Denoising steps."}),
                "cfg": (
                    "FLOAT",
                    {
                        "default": 4.5,
                        "min": 0.0,
                        "max": 100.0,
                        "step": 0.1,
                        "round": 0.01,
                        "tooltip": "Classifier-free guidance scale (1.0 for Flux dev/schnell: no negative pass).",
                    },
                ),
                "sampler_name": (samplers, {"default": "euler", "tooltip": "ComfyUI sampler."}),
                "scheduler": (schedulers, {"default": "simple", "tooltip": "ComfyUI scheduler."}),
                "denoise": (
                    "FLOAT",
                    {
                        "default": 1.0,
                        "min": 0.0,
                        "max": 1.0,
                        "step": 0.01,
                        "tooltip": "Below 1 keeps part of the input latent.",
                    },
                ),
            },
            "optional": {
                "sigmas": ("SIGMAS", {"tooltip": "Custom sigma schedule (replaces steps, scheduler and denoise)."}),
                "guidance": (
                    "FLOAT",
                    {
                        "default": 3.5,
                        "min": 0.0,
                        "max": 100.0,
                        "step": 0.1,
                        "tooltip": "Flux / FLUX.2 distilled guidance (a FluxGuidance node on positive overrides it). Ignored by SD3, PixArt and Qwen-Image.",
                    },
                ),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, steps: int, denoise: float) -> bool | str:
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10000:
            return f"steps {steps!r} must be a whole number from 1 to 10000"
        if not isinstance(denoise, (int, float)) or not 0.0 <= denoise <= 1.0:
            return f"denoise {denoise!r} must be between 0 and 1"
        if denoise > 0.0 and int(steps * denoise) < 1:
            return f"denoise {denoise} with {steps} steps leaves no step to run; raise steps or denoise"
        return True

    def sample(
        self,
        parallel_model: ParallelModelHandle,
        positive: list,
        negative: list,
        latent_image: dict,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        denoise: float,
        sigmas: Any = None,
        guidance: float = 3.5,
    ) -> tuple[dict]:
        ctx = self.context
        model = parallel_model.model()
        family = model.family
        frame_axis = getattr(model, "latent_frame_axis", False)
        spatial = getattr(model, "spatial_factor", 8)
        samples = prepare_latent(latent_image, model.latent_channels, family, spatial, frame_axis)
        expected = model.expected_conditioning()
        pos, pos_extra = to_runtime(positive, expected, family, "positive")
        neg = to_runtime(negative, expected, family, "negative")[0] if negative is not None else None
        distilled = family in ("flux", "flux2")  # the families with an embedded (distilled) guidance input
        flux_guidance = float(pos_extra.get("guidance", guidance)) if distilled else None
        batch, _, h, w = samples.shape
        total = (len(sigmas) - 1) if sigmas is not None else steps
        monitor = JobMonitor(ctx.bridge, ctx.status, parallel_model.pool_id, family, total, len(parallel_model.devices))

        def job(on_event, should_cancel):
            return model.sample(
                pos,
                neg,
                samples,
                width=w * spatial,
                height=h * spatial,
                batch_size=batch,
                seed=int(seed),
                steps=int(steps),
                cfg=float(cfg),
                sampler_name=sampler_name,
                scheduler=scheduler,
                denoise=float(denoise),
                sigmas=sigmas,
                guidance=flux_guidance,
                on_event=on_event,
                should_cancel=should_cancel,
            )

        ctx.status.job(parallel_model.pool_id, "sample", "running")
        try:
            out = run_with_events(job, monitor.handle, ctx.bridge)
        except JobCancelled as exc:
            ctx.status.job(parallel_model.pool_id, "sample", "cancelled")
            ctx.bridge.raise_interrupted(exc)
            raise
        except BaseException as exc:
            state = "cancelled" if type(exc).__name__ == "InterruptProcessingException" else "error"
            ctx.status.job(parallel_model.pool_id, "sample", state, str(exc))
            raise
        ctx.status.job(parallel_model.pool_id, "sample", "done")
        result = {k: v for k, v in latent_image.items() if k not in ("samples", "noise_mask")}
        result["samples"] = out.unsqueeze(2) if frame_axis else out  # ComfyUI's own layout for the family
        return (result,)
