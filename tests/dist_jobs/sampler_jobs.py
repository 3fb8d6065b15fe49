"""Worker-side job for tests/test_sampler_matrix.py: many generations in one pool job, so one warm pool
runs every sampler of a layout without a round trip per sampler."""

from __future__ import annotations

import torch

from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.service.model_jobs import generate


def generate_each(
    ctx,
    positive: Conditioning,
    negative: Conditioning,
    latent: torch.Tensor,
    runs: list[dict],
    patches: int | None = None,
    warmup: int = 1,
) -> list[torch.Tensor | str]:
    """``generate`` for each run (SamplingSettings fields); a ConfigError becomes its message (every
    rank raises it at the same point, before any collective)."""
    out: list[torch.Tensor | str] = []
    for run in runs:
        try:
            latent_out = generate(
                ctx, positive, negative, latent, SamplingSettings(**run), preview=False, patches=patches, warmup=warmup
            )
        except ConfigError as exc:
            out.append(str(exc))
            continue
        out.append(latent_out)
    return out
