"""Reference images (edit models: FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2) under PipeFusion.

The reference tokens ride with the image: every whole-image (warmup) item and, after warmup, each step's first
patch carry them through every stage (``reference_kv="per_step"``); the step's other patches carry image tokens
only and attend over the reference K/V left in the stage's buffers (stale_kv.py keeps them as a fixed segment).
So a stage runs the reference tokens once per step, not once per patch.

What is stale: their K/V depend on the step (the timestep's modulation) and on the image tokens they attend to
(for the patches not yet run in the step, one step old, like any patch's). Keeping them from the warmup step for
every later step (``"kept"``) was measured several times further from one device than refreshing them per step,
an error that does not shrink with more steps (README, *Reference images under PipeFusion*), so it is only a
measured alternative; ``"recomputed"`` (with every patch) is the cost baseline of ``bench edit``.
"""

from __future__ import annotations

import torch

from ..denoise.settings import SamplingSettings
from ..errors import ConfigError
from .run_settings import PipeFusionSettings
from .schedule import Band

MODES = ("per_step", "kept", "recomputed")
REFERENCES_WITH_BLOCK_CACHE = (
    "reference images (ReferenceLatent) with a block cache under PipeFusion",
    "the block cache keeps each patch's residuals, while the reference tokens run with one patch per step",
    "sample reference images under PipeFusion without the block cache, or use Ulysses / Ring / CFG parallelism",
)
REFERENCES_KEPT_WITHOUT_WARMUP = (
    "reference_kv='kept' under PipeFusion with warmup 0",
    "'kept' computes the reference tokens' K/V in the whole-image warmup steps only",
    "set warmup to 1 or more, or use reference_kv='per_step' (the default)",
)


def check_references(settings: SamplingSettings, options: PipeFusionSettings, sigmas: torch.Tensor) -> None:
    """Reference images run without a block cache, and an item computes their K/V before patches read it."""
    if settings.block_cache is not None:
        raise ConfigError(*REFERENCES_WITH_BLOCK_CACHE)
    if options.reference_kv not in MODES:
        raise ConfigError(
            f"PipeFusion reference_kv={options.reference_kv!r}",
            "the reference tokens run with each step's first patch (per_step), or, as measured alternatives, "
            "with every patch (recomputed) or in the whole-image steps only (kept)",
            "use 'per_step' (the default)",
        )
    if options.reference_kv == "kept" and options.warmup < 1 and len(sigmas) > 1:
        raise ConfigError(*REFERENCES_KEPT_WITHOUT_WARMUP)


def carries_references(band: Band, options: PipeFusionSettings) -> bool:
    """Whether an item of ``band`` runs the reference tokens: whole-image items and (``per_step``) each step's
    first patch do; the other patches attend over the K/V those left in the stage's buffers."""
    mode = options.reference_kv
    return band.index is None or mode == "recomputed" or (mode == "per_step" and band.index == 0)
