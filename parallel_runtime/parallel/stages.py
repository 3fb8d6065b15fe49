"""PipeFusion stage plan: which contiguous range of transformer blocks each pipeline stage runs.

It sits with the layout (not in ``pipefusion/``) because the layout planner sizes stages by their bytes.

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


def balanced_counts(
    block_bytes: Sequence[float],
    pp: int,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    capacities: Sequence[float] | None = None,
) -> tuple[int, ...]:
    """Blocks per stage for ``pp`` contiguous stages that balance the bytes each holds: stage ``s`` holds
    its blocks' ``block_bytes`` (+ ``first_extra`` on the first stage, ``last_extra`` on the last), and the
    largest ratio held / ``capacities[s]`` (equal capacities by default) is as small as it can be. Blocks of
    different sizes (Flux's double blocks are twice its single ones) then do not pile up on one stage.
    The counts can be given to :func:`plan_stages` as exact stage weights."""
    n = len(block_bytes)
    if pp < 1 or n < pp:
        raise ConfigError(
            f"{pp} stages for {n} blocks", "every pipeline stage needs at least one block", f"use pp <= {n}"
        )
    caps = [1.0] * pp if capacities is None else [float(c) for c in capacities]
    prefix = [0.0]
    for b in block_bytes:
        prefix.append(prefix[-1] + float(b))

    def load(s: int, a: int, b: int) -> float:
        held = prefix[b] - prefix[a] + (first_extra if s == 0 else 0.0) + (last_extra if s == pp - 1 else 0.0)
        return held / caps[s]

    # best[s][i]: smallest possible largest load when stages 0..s-1 hold blocks 0..i-1; cut[s][i]: where stage s-1 starts
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for s in range(1, pp + 1):
        for i in range(s, n - (pp - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], load(s - 1, j, i))
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    counts, i = [], n
    for s in range(pp, 0, -1):
        j = cut[s][i]
        counts.append(i - j)
        i = j
    return tuple(reversed(counts))
