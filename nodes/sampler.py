"""Parallel Sampler: KSampler's inputs, run on the worker pool, with progress, previews and cancel.

It computes what ComfyUI's KSampler computes for the same graph: the model sampling in force (the
file's default unless a Parallel Model Sampling node set one; the node shows which), each
conditioning entry with its own guidance, strength and timestep range, the LATENT's batch_index for
the noise (and kept on the output), an empty latent left unshifted, sizes padded to the patch size.
"""

from __future__ import annotations

import logging
from typing import Any

from parallel_runtime.errors import ConfigError, JobCancelled
from parallel_runtime.service.families import takes_guidance

from .conditioning import to_branch
from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY
from .progress import JobMonitor, run_with_events

log = logging.getLogger("dit_parallel.nodes")
SEED_MAX = 0xFFFFFFFFFFFFFFFF


def sampler_names() -> tuple[list[str], list[str]]:
    """ComfyUI 0.3.64's sampler and scheduler lists, same order, as lists (ComfyUI validates a combo
    choice only when its options are a list)."""
    from parallel_runtime.sampling import SAMPLER_NAMES, SCHEDULER_NAMES

    return list(SAMPLER_NAMES), list(SCHEDULER_NAMES)


def prepare_latent(
    latent: Any,
    channels: int,
    family: str,
    latent_dims: int = 2,
    spatial_factor: int = 8,
    patch_pixels: int = 16,
    frame_axis: bool = False,
) -> Any:
    """The LATENT's samples as float32 [B,C,H,W] (video models: [B,C,T,H,W]), checked against the model
    (``frame_axis``: an image family whose LATENT may be [B,C,1,H,W], as ComfyUI keeps Qwen-Image's). An image
    latent's size is checked against the model's limits by the runtime (it pads to the patch as ComfyUI);
    a video latent must be whole tokens (``patch_pixels``).

    As ComfyUI's own KSampler does (``fix_empty_latent_channels``): an all-zero latent with another
    channel count (EmptyLatentImage is 4-channel, EmptyHunyuanLatentVideo 16) becomes zeros with the
    model's channels, and an image latent given to a video model is one frame."""
    import torch

    if not isinstance(latent, dict) or not isinstance(latent.get("samples"), torch.Tensor):
        raise ConfigError(
            "latent_image is not a LATENT",
            "a LATENT is a dict with a 'samples' tensor",
            "connect Parallel Empty Latent, EmptySD3LatentImage, VAEEncode or another LATENT output",
        )
    if latent.get("noise_mask") is not None and latent_dims != 3:
        raise ConfigError(
            "latent_image carries a noise mask (inpainting)",
            "the parallel sampler applies a noise mask only for video models (Wan22ImageToVideoLatent)",
            "remove Set Latent Noise Mask / VAE Encode (for Inpainting), or use ComfyUI's KSampler for inpainting",
        )
    samples = latent["samples"]
    if frame_axis and latent_dims == 2 and samples.ndim == 5 and samples.shape[2] == 1:
        samples = samples[:, :, 0]
    if latent_dims == 3 and samples.ndim == 4:
        samples = samples.unsqueeze(2)
    if samples.ndim != 2 + latent_dims:
        shape = "[batch, channels, frames, height, width]" if latent_dims == 3 else "[batch, channels, height, width]"
        raise ConfigError(
            f"latent_image has shape {tuple(samples.shape)}",
            f"this {family} model takes latents {shape}",
            "use a video latent (EmptyHunyuanLatentVideo, WanImageToVideo, Parallel Empty Latent with length)"
            if latent_dims == 3
            else "use an image latent (video latents are 5-D)",
        )
    if samples.shape[1] != channels:
        if not torch.any(samples):
            log.info(
                "empty %d-channel latent replaced by an empty %d-channel one for %s", samples.shape[1], channels, family
            )
            samples = torch.zeros(samples.shape[0], channels, *samples.shape[2:])
        else:
            raise ConfigError(
                f"latent_image has {samples.shape[1]} channels but this {family} model works with {channels}",
                "a latent is only meaningful to the VAE (and model) that made it",
                "encode the image with this model's VAE (16 channels for Flux/SD3/Wan 2.1, 4 for PixArt, "
                "48 for Wan 2.2 TI2V-5B)",
            )
    h, w = samples.shape[-2:]
    width, height = w * spatial_factor, h * spatial_factor
    if latent_dims == 3 and (width % patch_pixels or height % patch_pixels):  # Wan does not pad (yet)
        raise ConfigError(
            f"the latent is {width}x{height} pixels; width and height must be multiples of {patch_pixels}",
            f"the transformer packs 2x2 latent pixels ({patch_pixels}x{patch_pixels} image pixels) into one token",
            f"resize to {width // patch_pixels * patch_pixels}x{height // patch_pixels * patch_pixels} "
            "(e.g. with Upscale Latent or ImageScale before VAE Encode)",
        )
    return samples.float().cpu()


def prepare_noise_mask(latent: dict, samples: Any) -> Any:
    """The LATENT's noise mask (Wan22ImageToVideoLatent: [B,1,T,H,W], 0 where the start frame is kept) as
    float32, or None. The workers bring it to the latent's shape as ComfyUI does (``reshape_mask``)."""
    import torch

    mask = latent.get("noise_mask")
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.shape[-2:] != samples.shape[-2:]:
        raise ConfigError(
            f"the LATENT's noise_mask has shape {tuple(getattr(mask, 'shape', ()))}, the latent {tuple(samples.shape)}",
            "the parallel sampler takes a noise mask at the latent's own size (as Wan22ImageToVideoLatent makes it)",
            "make the latent and its mask with the same node",
        )
    return mask.float().cpu()


def model_geometry(model: Any) -> dict[str, int]:
    """What prepare_latent needs to know of a ParallelModel."""
    return {
        "latent_dims": model.latent_dims,
        "spatial_factor": model.spatial_factor,
        "patch_pixels": model.patch_pixels,
        "frame_axis": getattr(model, "latent_frame_axis", False),
    }


def run_sampler(
    ctx: Any, parallel_model: ParallelModelHandle, positive: Any, negative: Any, latent_image: dict, **settings: Any
) -> dict[str, Any]:
    """Sample on the pool with progress, previews, cancel and status (shared by both sampler nodes); returns
    the node's output ({"ui": the model sampling in force, "result": (LATENT,)}).
    ``settings``: ParallelModel.sample's keyword arguments (seed, steps, ..., advanced)."""
    model = parallel_model.model()
    family = model.family
    geometry = model_geometry(model)
    samples = prepare_latent(latent_image, model.latent_channels, family, **geometry)
    noise_mask = prepare_noise_mask(latent_image, samples)
    expected = model.expected_conditioning()
    pos = to_branch(positive, expected, family, "positive")
    neg = to_branch(negative, expected, family, "negative") if negative is not None else None
    guidance = settings.pop("guidance", None)
    guidance = float(guidance) if takes_guidance(family) and guidance is not None else None
    batch_index = latent_image.get("batch_index")
    sigmas = settings.get("sigmas")
    total = (len(sigmas) - 1) if sigmas is not None else settings["steps"]
    monitor = JobMonitor(ctx.bridge, ctx.status, parallel_model.pool_id, family, total, len(parallel_model.devices))
    in_force = sampling_text(model)
    log.info("dit-parallel sampler: %s", in_force)
    h, w = samples.shape[-2:]
    f = model.spatial_factor
    kwargs = dict(width=w * f, height=h * f, batch_size=samples.shape[0], guidance=guidance, **settings)
    kwargs["batch_index"] = None if batch_index is None else [int(i) for i in batch_index]
    if noise_mask is not None:
        kwargs["noise_mask"] = noise_mask

    def job(on_event, should_cancel):
        return model.sample(pos, neg, samples, on_event=on_event, should_cancel=should_cancel, **kwargs)

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
    # KSampler's copy: batch_index and a noise mask stay with the latent (a second pass reads the mask)
    result = dict(latent_image)
    result["samples"] = out.unsqueeze(2) if geometry["frame_axis"] else out  # ComfyUI's layout for the family
    return {"ui": {"text": [in_force]}, "result": (result,)}


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
                "sampler": (
                    "SAMPLER",
                    {
                        "tooltip": "A ComfyUI SAMPLER (KSamplerSelect, SamplerEulerAncestral, SamplerDPMPP_2M_SDE, "
                        "...): replaces sampler_name and brings its eta / s_noise."
                    },
                ),
                "guidance": (
                    "FLOAT",
                    {
                        "default": 3.5,
                        "min": 0.0,
                        "max": 100.0,
                        "step": 0.1,
                        "tooltip": "Flux / FLUX.2 distilled guidance of conditioning entries without their own "
                        "(FluxGuidance sets it per entry, on the negative too; KSampler uses 3.5). Ignored by SD3, "
                        "PixArt, Qwen-Image and Wan.",
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
        sampler: Any = None,
    ) -> dict[str, Any]:
        options: dict[str, float] = {}
        if sampler is not None:
            from .sampler_input import sampler_from_input

            sampler_name, options = sampler_from_input(sampler)
        return run_sampler(
            self.context,
            parallel_model,
            positive,
            negative,
            latent_image,
            seed=int(seed),
            steps=int(steps),
            cfg=float(cfg),
            sampler_name=sampler_name,
            scheduler=scheduler,
            denoise=float(denoise),
            sigmas=sigmas,
            guidance=guidance,
            **options,
        )


def sampling_text(model: Any) -> str:
    """What the sampler node shows: the model sampling in force and where it comes from."""
    spec = getattr(model, "model_sampling", None)
    if spec is None:
        return "model sampling: the model's default"
    text = f"model sampling: {spec.describe()}"
    if spec.source == "the model file's default" and spec.kind in ("flux_flow", "discrete_flow"):
        text += "; a Parallel Model Sampling node before the sampler changes it"
    return text
