"""The ranks that take one cache decision together, and the global sums they decide on.

A cache decision (reuse or compute) must be the same on every rank that runs the same blocks: a rank
that skipped a step while its neighbours computed it would leave them waiting in a collective. So no rank
decides from what it holds alone. Every quantity a rule compares is a sum over the whole sequence and
every conditioning branch: each rank adds up its part (its share of a tensor it holds in full with the
others, or the slice it computed), one tiny all-reduce over the decision group ("stage": cfg x sp, the
whole mesh when pp = 1) adds the parts, and every rank reads the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from ...parallel.collectives import all_reduce_sum
from ...parallel.mesh import ParallelMesh
from ...parallel.sharding import split_sizes

Among = Literal["stage", "sp"]


class DecisionGroup:
    """The decision group of one rank: shares of replicated tensors and global sums over the group."""

    def __init__(self, mesh: ParallelMesh):
        self.mesh = mesh
        self.group = mesh.group("stage")

    def share(self, t: torch.Tensor, among: Among) -> torch.Tensor:
        """This rank's part of ``t`` (flattened, balanced split) when every rank of ``among`` holds all of
        it: "stage" for what the whole group holds (the latent), "sp" for what one branch's sequence-parallel
        ranks hold (a gathered prediction under CFG parallel). The parts of all holders partition ``t``."""
        size, index = self.mesh.size(among), self.mesh.rank(among)
        flat = t.reshape(-1)
        if size == 1:
            return flat
        sizes = split_sizes(flat.numel(), size)
        start = sum(sizes[:index])
        return flat[start : start + sizes[index]]

    def sums(self, values: Sequence[torch.Tensor | float]) -> list[float]:
        """Each value (a number or a one-element tensor) summed over the decision group, in float64: the
        same numbers on every rank."""
        local = self.contributions(values)
        return all_reduce_sum(local, self.group, self.mesh.stats, op="cache").tolist()

    def contributions(self, values: Sequence[torch.Tensor | float]) -> torch.Tensor:
        """What this rank adds to the sums, as one float64 tensor on its device (a seam for tests that make
        one rank's part differ)."""
        device = self.mesh.device
        parts = [
            v.to(device, torch.float64).reshape(())
            if isinstance(v, torch.Tensor)
            else torch.tensor(float(v), dtype=torch.float64, device=device)
            for v in values
        ]
        return torch.stack(parts)

    def sum_over_branches(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the CFG-parallel ranks (each holding its branch's part); unchanged without them."""
        if self.mesh.size("cfg") == 1:
            return t
        return all_reduce_sum(t.contiguous(), self.mesh.group("cfg"), self.mesh.stats, op="cache")


def abs_sum(t: torch.Tensor) -> torch.Tensor:
    """sum |t| in float64 (the parts of a mean absolute value)."""
    return t.double().abs().sum()
