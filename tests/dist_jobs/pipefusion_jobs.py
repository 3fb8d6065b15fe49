"""Worker-side jobs for the PipeFusion tests."""

from __future__ import annotations

from typing import Any

import torch

from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import JobCancelled
from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.collectives import agree_any
from parallel_runtime.pipefusion.pipeline import PipeFusionSettings, run_pipefusion
from parallel_runtime.service.load_job import loaded_model


def cancel_after_step(
    ctx,
    positive: Conditioning,
    negative: Conditioning | None,
    latent: torch.Tensor,
    settings: SamplingSettings,
    patches: int,
    warmup: int,
    cancel_step: int,
    agree_cancel_every: str = "step",
) -> dict[str, Any]:
    """PipeFusion where the reporting rank (last stage) raises a cancel flag as soon as it has
    finished step ``cancel_step``; every rank agrees on it through the pipeline's own cancel
    agreement. Returns the steps this rank saw finish, how often it agreed, and whether it ended cancelled."""
    model = loaded_model(ctx)
    ms = model_sampling_for(model.adapter)
    flag, finished, agreements = [False], [], [0]

    def on_step(step: int, total: int, denoised: torch.Tensor) -> None:
        finished.append(step)
        if step == cancel_step:
            flag[0] = True

    def check() -> None:
        agreements[0] += 1
        if agree_any(flag[0]):
            raise JobCancelled("cancelled by the test")

    slots = None
    try:
        _, stats = run_pipefusion(
            model.adapter,
            ctx.mesh,
            model.stages,
            ms,
            positive,
            negative,
            latent,
            settings,
            PipeFusionSettings(patches, warmup, agree_cancel_every=agree_cancel_every),  # type: ignore[arg-type]
            attention_backend=model.attention,
            check_cancel=check,
            on_step=on_step,
            message_tag=ctx.job_id,
        )
        cancelled, slots = False, stats.slots
    except JobCancelled:
        cancelled = True
    return {"finished": finished, "agreements": agreements[0], "cancelled": cancelled, "slots": slots}
