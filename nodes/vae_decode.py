"""Parallel VAE Decode: the model's VAE decodes a LATENT across the workers (exact, in row bands)."""

from __future__ import annotations

from typing import Any

from parallel_runtime.errors import ConfigError

from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .loader import CATEGORY


class ParallelVAEDecode(ContextNode):
    """Decodes latents with the VAE that came with the parallel model."""

    DESCRIPTION = "Decodes a LATENT with the parallel model's VAE, split across the workers (same result as one GPU)."
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE",)
    OUTPUT_TOOLTIPS = (
        "The decoded images [batch, height, width, 3], values 0..1; a video's frames one after another "
        "(Wan: 4*T-3 frames per latent of T frames) for SaveAnimatedWEBP / CreateVideo.",
    )
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "parallel_model": (PARALLEL_MODEL, {"tooltip": "From Parallel Model Loader (its VAE decodes)."}),
                "samples": ("LATENT", {"tooltip": "The latent to decode."}),
            }
        }

    def decode(self, parallel_model: ParallelModelHandle, samples: dict) -> tuple[Any]:
        import torch

        model = parallel_model.model()
        latent = samples.get("samples") if isinstance(samples, dict) else None
        dims = getattr(model, "latent_dims", 2)
        if dims == 2 and isinstance(latent, torch.Tensor) and latent.ndim == 5 and latent.shape[2] == 1:
            latent = latent[:, :, 0]  # an image family whose LATENT carries a frame axis (Qwen-Image)
        if dims == 3 and isinstance(latent, torch.Tensor) and latent.ndim == 4:
            latent = latent.unsqueeze(2)  # one frame (ComfyUI's video VAEs take image latents so too)
        if not isinstance(latent, torch.Tensor) or latent.ndim != 2 + dims:
            shape = "[batch, channels, frames, height, width]" if dims == 3 else "[batch, channels, height, width]"
            raise ConfigError(
                f"samples is not a LATENT this {model.family} VAE decodes",
                f"the VAE decodes latents shaped {shape}",
                "connect a LATENT output of this model (Parallel Sampler, VAE Encode, ...)",
            )
        if latent.shape[1] != model.latent_channels:
            raise ConfigError(
                f"the latent has {latent.shape[1]} channels but this {model.family} VAE expects {model.latent_channels}",
                "a latent can only be decoded by the VAE family that made it",
                "decode it with the matching VAE (ComfyUI's VAEDecode with the right VAE), or sample with this model",
            )
        ctx = self.context
        ctx.status.job(parallel_model.pool_id, "decode", "running")
        try:
            image = model.decode(latent.float().cpu())
        except BaseException as exc:
            ctx.status.job(parallel_model.pool_id, "decode", "error", str(exc))
            raise
        ctx.status.job(parallel_model.pool_id, "decode", "done")
        return (image.float().clamp(0.0, 1.0),)
