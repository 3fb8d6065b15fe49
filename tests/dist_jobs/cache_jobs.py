"""Worker-side jobs for tests/test_caches_layouts.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from parallel_runtime.denoise.caching.decisions import DecisionGroup
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.service.load_job import loaded_model


class SkewedGroup(DecisionGroup):
    """A decision group whose rank ``skewed_rank`` adds ``factor`` times its first value (a change): that rank's
    local measure differs from the others'. Records every local part and the sums."""

    def __init__(self, mesh, skewed_rank: int, factor: float):
        super().__init__(mesh)
        self.skewed_rank, self.factor = skewed_rank, factor
        self.parts: list[list[float]] = []
        self.totals: list[list[float]] = []

    def contributions(self, values: Sequence[torch.Tensor | float]) -> torch.Tensor:
        local = super().contributions(values)
        if self.mesh.global_rank == self.skewed_rank:
            local[0] *= self.factor
        self.parts.append(local.tolist())
        return local

    def sums(self, values: Sequence[torch.Tensor | float]) -> list[float]:
        totals = super().sums(values)
        self.totals.append(totals)
        return totals


def skewed_decisions(
    ctx,
    positive: Conditioning,
    negative: Conditioning | None,
    latent: torch.Tensor,
    settings: SamplingSettings,
    skewed_rank: int = 1,
    factor: float = 3.0,
) -> dict[str, Any]:
    """Denoise with a decision group whose ``skewed_rank`` measures a different local change; returns what the
    caches did on this rank, its local parts and the sums every rank decided on."""
    model = loaded_model(ctx)
    group = SkewedGroup(ctx.mesh, skewed_rank, factor)
    reports: list[dict] = []
    denoise_latent(
        model.adapter,
        ctx.mesh,
        model_sampling_for(model.adapter, settings.model_sampling),
        positive.to(ctx.device),
        None if negative is None else negative.to(ctx.device),
        latent.to(ctx.device),
        settings,
        attention_backend=model.attention,
        cache_report=reports.extend,
        decision_group=group,
    )
    return {"reports": reports, "parts": group.parts, "totals": group.totals}


def compile_report(ctx) -> dict[str, int]:
    """This worker's torch compile counters (graphs and frames compiled so far)."""
    from parallel_runtime.models.compiled_blocks import compile_counters

    return compile_counters()
