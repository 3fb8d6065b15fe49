"""PipeFusion stage plan: which contiguous range of transformer blocks each pipeline stage runs.

The adapter's block lists (e.g. Flux's double then single blocks) form one sequence in execution
order; ``pp`` stages take contiguous pieces of it. By default every stage gets the same number of
blocks (the first ``n % pp`` stages one more); relative weights give a bigger card more blocks
(mixed GPUs), and integer weights that sum to the block count are taken as exact block counts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """Block ranges of the pipeline stages: stage ``s`` runs blocks ``bounds[s]:bounds[s + 1]``."""

    bounds: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_blocks(self) -> int:
        return self.bounds[-1]

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.bounds, self.bounds[1:]))

    def blocks(self, stage: int) -> range:
        """The block indices (execution order over all block lists) of ``stage``."""
        return range(self.bounds[stage], self.bounds[stage + 1])

    def describe(self) -> str:
        return " | ".join(f"{a}-{b - 1}" for a, b in zip(self.bounds, self.bounds[1:]))


def plan_stages(num_blocks: int, pp: int, weights: Sequence[float] | None = None) -> StagePlan:
    """Split ``num_blocks`` blocks into ``pp`` contiguous non-empty stages.

    ``weights`` (one positive number per stage, e.g. free memory or speed of each stage's GPU)
    share the blocks proportionally (largest remainders, at least one block per stage); None
    shares them equally. Raises ConfigError before any work when the split is impossible."""
    if pp < 1:
        raise ConfigError(f"pp={pp}", "a pipeline needs at least one stage", "use pp >= 1")
    if num_blocks < pp:
        raise ConfigError(
            f"PipeFusion with {pp} stages on a model of {num_blocks} transformer blocks",
            "every pipeline stage needs at least one block of its own",
            f"use pp <= {num_blocks} and give the other devices to ulysses, ring or cfg parallelism",
        )
    if weights is None:
        base, extra = divmod(num_blocks, pp)
        counts = [base + (1 if s < extra else 0) for s in range(pp)]
    else:
        counts = _weighted_counts(num_blocks, pp, weights)
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return StagePlan(tuple(bounds))


def _weighted_counts(num_blocks: int, pp: int, weights: Sequence[float]) -> list[int]:
    values = list(weights)
    if len(values) != pp:
        raise ConfigError(
            f"{len(values)} stage weights ({', '.join(map(str, values))}) for {pp} pipeline stages",
            "each PipeFusion stage needs one weight (its share of the transformer blocks)",
            f"give exactly {pp} positive numbers, or none for an equal split",
        )
    bad = [w for w in values if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0 or math.isinf(w)]
    if bad:
        raise ConfigError(
            f"stage weights {values} contain {bad[0]!r}",
            "a stage weight is the relative share of blocks that stage runs, so it must be a positive finite number",
            "use positive numbers such as (1, 1) for an even split or (24, 16) for a bigger first card",
        )
    total = float(sum(values))
    ideal = [w / total * num_blocks for w in values]
    counts = [max(1, math.floor(x)) for x in ideal]
    # Hand out (or take back) blocks by largest remainder until the counts sum to num_blocks.
    while sum(counts) < num_blocks:
        s = max(range(pp), key=lambda i: (ideal[i] - counts[i], -i))
        counts[s] += 1
    while sum(counts) > num_blocks:
        s = min((i for i in range(pp) if counts[i] > 1), key=lambda i: (ideal[i] - counts[i], i))
        counts[s] -= 1
    return counts
