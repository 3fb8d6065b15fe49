"""Cancel inside a step: the ranks agree on the cancel flag at transformer block boundaries.

Every rank reads the host's cancel flag from shared memory, but not at the same instant, so a rank must
never act on its own reading: all ranks stop at the same boundary or none does (one waiting alone in a
collective would hang). :class:`BlockCancel` therefore counts boundaries and, every ``k``-th one, does
one tiny all-reduce (MAX) of [this rank's flag, the nanoseconds its last ``k`` boundaries took]; every
rank gets the same two numbers back, so all raise together, and all pick the same next ``k``: as many
boundaries as take about ``interval_s`` on the slowest rank. The cost is one small all-reduce per
``interval_s`` whatever the block time (a big model's block: every block or so; a tiny model's: every
few hundred), and a cancel takes effect within about ``interval_s`` plus one block.

Only for code where every rank passes the same number of boundaries in the same order (the whole-model
forward of every layout but PipeFusion, whose stages run different blocks and agree per patch instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import JobCancelled
from ..parallel.collectives import agree_max

DEFAULT_INTERVAL_S = 0.25
MAX_EVERY = 1 << 20


class BlockCancel:
    """Call it at each block boundary (the same boundaries on every rank); raises JobCancelled on
    every rank together once the host asked any of them to cancel."""

    def __init__(self, flag: Callable[[], bool], what: str, interval_s: float = DEFAULT_INTERVAL_S):
        self.flag, self.what = flag, what
        self.interval_ns = int(interval_s * 1e9)
        self.every = 1  # boundaries between agreements (the same on every rank)
        self.count = 0
        self.since = time.perf_counter_ns()
        self.agreements = 0
        self.agree_ns = 0  # time spent in the agreements (their cost, waiting for a slower rank included)

    def __call__(self) -> None:
        self.count += 1
        if self.count < self.every:
            return
        now = time.perf_counter_ns()
        cancelled, slowest = agree_max([int(self.flag()), now - self.since])
        self.agreements += 1
        self.agree_ns += time.perf_counter_ns() - now
        if cancelled:
            raise JobCancelled(f"{self.what} cancelled")
        per_boundary = max(slowest // self.count, 1)
        self.every = min(max(self.interval_ns // per_boundary, 1), MAX_EVERY)
        self.count, self.since = 0, time.perf_counter_ns()
