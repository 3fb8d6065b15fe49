"""The block cache under PipeFusion: the stage holding the first blocks decides per item, the others follow.

A step's patches are in flight at once, so the decision is taken per item (a patch of a step, or the whole
image in warmup) against the same band's last fully computed item. Stage 0 runs the first blocks of every
branch of the item, and its ranks (cfg x sp: both CFG pipelines decide together) compare the first blocks'
residual over the whole band; the decision travels with the item's activations (a flag) so every later
stage knows it before it starts the item. A stage that reuses adds its own cached residual of the middle
blocks it holds (the stages' residuals add up to the middle blocks' residual) and keeps the stale K/V of
those blocks as they are: every rank of the stage does the same, so the buffers stay consistent. The last
``last_blocks`` blocks (on the last stage) always run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

from ..denoise.caching.block_cache import BlockSlot, apply_residual, decide, keep_residual, residual_fields
from ..denoise.caching.decisions import DecisionGroup
from ..denoise.caching.specs import BlockCacheSpec
from ..errors import ConfigError
from ..models.base import Activations, ModelAdapter
from ..parallel.stages import StagePlan

STEP_CACHE_UNDER_PIPEFUSION = (
    "a step cache (EasyCache / LazyCache) on a PipeFusion layout",
    "the step cache decides from the whole step's prediction before the next step starts, while PipeFusion "
    "already runs the next step's first patches",
    "use Parallel Block Cache (it decides per patch under PipeFusion), or a layout without PipeFusion",
)
RunBlock = Callable[[Activations, int, int], Activations]  # (acts, block index, branch) -> acts


class StageBlockCache:
    """One stage's side of the block cache for one generation."""

    def __init__(self, spec: BlockCacheSpec, group: DecisionGroup, stages: StagePlan, stage: int, num_blocks: int):
        spec.check_blocks(num_blocks)
        first_stage, last_stage = stages.blocks(0), stages.blocks(stages.num_stages - 1)
        if spec.first_blocks > len(first_stage) or spec.last_blocks > len(last_stage):
            raise ConfigError(
                f"the block cache computes the first {spec.first_blocks} and last {spec.last_blocks} blocks; the "
                f"PipeFusion stages hold {stages.describe()}",
                "the first blocks must sit on the first stage (it decides) and the last ones on the last stage",
                f"use first_blocks <= {len(first_stage)} and last_blocks <= {len(last_stage)}",
            )
        self.spec, self.group = spec, group
        mine = stages.blocks(stage)
        middle_end = num_blocks - spec.last_blocks
        self.first = [i for i in mine if i < spec.first_blocks]
        self.middle = [i for i in mine if spec.first_blocks <= i < middle_end]
        self.last = [i for i in mine if i >= middle_end]
        self.decides = stage == 0
        self.slots: dict[Hashable, list[BlockSlot]] = {}  # per band: the decision state, then one per branch

    def run(
        self, adapter: ModelAdapter, band: Hashable, acts: list[Activations], run_block: RunBlock, reuse: bool | None
    ) -> tuple[list[Activations], bool]:
        """This stage's blocks for an item's ``acts`` (one per branch). ``reuse`` is the decision received
        from the previous stage (None on stage 0, which decides). Returns the activations and the decision."""
        slots = self.slots.setdefault(band, [BlockSlot() for _ in range(len(acts) + 1)])
        out, firsts = [], []
        for b, a in enumerate(acts):
            start = a.img
            for i in self.first:
                a = run_block(a, i, b)
            firsts.append(a.img - start)
            out.append(a)
        if self.decides:
            reuse = decide(self.spec, slots[0], self.group, torch.cat([f.reshape(-1) for f in firsts]))
        else:  # follow the first stage (and keep the same record, so every rank reports the same decisions)
            assert reuse is not None
            slots[0].calls += 1
            slots[0].reused += int(reuse)
            slots[0].trace.append(reuse)
        for b, a in enumerate(out):
            slot = slots[b + 1]
            if reuse:
                a = apply_residual(slot, a)
            elif self.middle:
                before = a
                for i in self.middle:
                    a = run_block(a, i, b)
                keep_residual(slot, residual_fields(adapter, before), before, a)
            for i in self.last:
                a = run_block(a, i, b)
            out[b] = a
        return out, reuse

    def summary(self) -> dict:
        deciding = [s[0] for s in self.slots.values()]
        return {
            "cache": "block cache",
            "calls": sum(s.calls for s in deciding),
            "reused": sum(s.reused for s in deciding),
            "trace": {str(k): list(s[0].trace) for k, s in self.slots.items()},
        }
