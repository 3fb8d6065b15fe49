"""First-block / dual-block residual cache (FBCache; cache-dit's DBCache), decided by every rank together.

A model call computes its first ``first_blocks`` blocks, then compares their residual (image hidden states
after them minus before) with the one of the last call that computed every block:
``sum |r - r_prev| / sum |r_prev|`` over the whole sequence (every sequence-parallel shard) and every
conditioning branch (batched, or on the other CFG rank). Under the threshold (after the warmup calls, and
at most ``max_consecutive`` times in a row) the middle blocks are skipped and their cached residual (image,
and the text for joint attention) is added instead; the last ``last_blocks`` blocks always run.

Each stream of model calls (the same conditioning entries step after step) has its own :class:`BlockSlot`.
A rank that holds none of a call's entries (CFG parallel with several entries) still joins its decisions
(:meth:`BlockCache.abstain`) so every rank makes the same collectives.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable

import torch

from ...models.base import Activations, AttentionScope, ModelAdapter
from .decisions import DecisionGroup, abs_sum
from .specs import BlockCacheSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BlockSlot:
    """The cache state of one stream of model calls (or one PipeFusion patch band)."""

    calls: int = 0
    reused: int = 0
    in_a_row: int = 0
    has_reference: bool = False  # a first-blocks residual of a fully computed call exists (on every rank)
    reference: torch.Tensor | None = None  # this rank's part of it
    residual: dict[str, torch.Tensor | None] = dataclasses.field(default_factory=dict)  # middle blocks' residual
    trace: list[bool] = dataclasses.field(default_factory=list)  # reused? per call


def decide(spec: BlockCacheSpec, slot: BlockSlot, group: DecisionGroup, first: torch.Tensor | None) -> bool:
    """Whether this call reuses the middle blocks (the same answer on every rank of ``group``). ``first``:
    this rank's part of the first blocks' residual (None where the rank computes none of the call)."""
    slot.calls += 1
    eligible = slot.calls > spec.warmup_steps and slot.has_reference and slot.in_a_row < spec.max_consecutive
    reuse = False
    if eligible:
        zero = torch.zeros((), dtype=torch.float64)
        change, size = zero, zero
        if first is not None and slot.reference is not None:
            change, size = abs_sum(first - slot.reference), abs_sum(slot.reference)
        change, size = group.sums([change, size])
        relative = change / size if size else float("inf")
        reuse = relative < spec.threshold
        if spec.verbose:
            log.info(
                "block cache: call %d relative change %.6g (threshold %g): %s",
                slot.calls,
                relative,
                spec.threshold,
                "reuse" if reuse else "compute",
            )
    if reuse:
        slot.in_a_row += 1
        slot.reused += 1
    else:
        slot.in_a_row = 0
        slot.has_reference = True
        slot.reference = None if first is None else first.detach().clone()
    slot.trace.append(reuse)
    return reuse


def residual_fields(adapter: ModelAdapter, acts: Activations) -> tuple[str, ...]:
    """The Activations fields the middle blocks change: the image, and the text in joint attention."""
    return ("img", "txt") if adapter.plan.text_attention == "joint" and acts.txt is not None else ("img",)


def keep_residual(slot: BlockSlot, fields: tuple[str, ...], before: Activations, after: Activations) -> None:
    """Store ``after - before`` of ``fields`` (None for a field the blocks consumed)."""
    slot.residual = {}
    for name in fields:
        new, old = getattr(after, name), getattr(before, name)
        slot.residual[name] = None if new is None else new - old


def apply_residual(slot: BlockSlot, acts: Activations) -> Activations:
    """``acts`` with the cached residual of the middle blocks added."""
    changes = {}
    for name, r in slot.residual.items():
        value = getattr(acts, name)
        changes[name] = None if r is None or value is None else value + r
    return acts.replace(**changes)


class BlockCache:
    """The block cache of one generation: a slot per stream of model calls, and the block runner each uses."""

    def __init__(self, spec: BlockCacheSpec, group: DecisionGroup):
        self.spec, self.group = spec, group
        self.slots: dict[Hashable, BlockSlot] = {}

    def slot(self, key: Hashable) -> BlockSlot:
        return self.slots.setdefault(key, BlockSlot())

    def runner(self, key: Hashable):
        """The block loop of a model call of stream ``key`` (``ModelAdapter.forward``'s ``blocks``)."""
        slot, spec, group = self.slot(key), self.spec, self.group

        def run(adapter: ModelAdapter, acts: Activations, attention: AttentionScope) -> Activations:
            total, first, last = adapter.num_blocks, spec.first_blocks, spec.last_blocks
            spec.check_blocks(total)
            start = acts.img
            acts = adapter.run_blocks(acts, attention, 0, first)
            if decide(spec, slot, group, acts.img - start):
                acts = apply_residual(slot, acts)
            else:
                before = acts
                acts = adapter.run_blocks(acts, attention, first, total - last)
                keep_residual(slot, residual_fields(adapter, before), before, acts)
            return adapter.run_blocks(acts, attention, total - last, total)

        return run

    def abstain(self, key: Hashable) -> None:
        """This rank holds none of the call's entries: join the decision with nothing to add."""
        decide(self.spec, self.slot(key), self.group, None)

    def summary(self) -> dict:
        calls = sum(s.calls for s in self.slots.values())
        reused = sum(s.reused for s in self.slots.values())
        return {
            "cache": "block cache",
            "calls": calls,
            "reused": reused,
            "trace": {str(k): list(s.trace) for k, s in self.slots.items()},
        }
