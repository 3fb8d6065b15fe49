"""Worker-side job for tests/test_controlnet_flux.py: a generation with the bytes this rank sent."""

from __future__ import annotations

from typing import Any

import torch

from parallel_runtime.denoise.entries import Branch
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.service.model_jobs import generate


def generate_with_stats(
    ctx, positive: Branch, negative: Branch | None, latent: torch.Tensor, settings: SamplingSettings
) -> dict[str, Any]:
    """``generate`` (the sampling job), then this rank's bytes sent per collective op (reset at job start)."""
    out = generate(ctx, positive, negative, latent, settings, preview=False)
    return {"latent": out, "sent": dict(ctx.mesh.stats.sent)}


def held_patch_blocks(ctx, file: str) -> list[int]:
    """The DiffSynth patch blocks this rank holds beside its (PipeFusion stage's) main blocks."""
    from parallel_runtime.service.controlnets import loaded_controlnets
    from parallel_runtime.service.load_job import loaded_model

    (runner,) = loaded_controlnets(ctx, loaded_model(ctx).adapter, [file]).values()
    return [i for i, block in enumerate(runner.blocks) if block is not None]
