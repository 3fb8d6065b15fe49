"""Timing that a disturbed run cannot bend: contenders interleaved, repeated, reported as median and spread.

A benchmark compares a baseline with one or more contenders (e.g. 1 rank against 2 ranks). Running
the baseline once and then the contenders lets one slow moment (another process on a shared
machine) inflate a ratio. :func:`interleave` runs every contender once per round, in an order that
rotates from round to round, for ``repeats`` rounds; :func:`ratio` divides medians and also reports
the per-round (paired) ratios, whose spread says how far a figure can be trusted::

    times = interleave({"1 rank": run_single, "2 ranks": run_pair}, repeats=5)
    res["seconds"] = {name: s.summary() for name, s in times.items()}
    res["speedup_2_ranks"] = ratio(times, "1 rank", "2 ranks")

Each contender is a callable returning the seconds it measured (e.g. timed inside a worker), or
``None`` to be timed here by wall clock around the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

Contender = Callable[[], "float | None"]


@dataclasses.dataclass(frozen=True)
class Samples:
    """The seconds of one contender, one value per round."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median: 0.05 means the runs lay within 5% of each other."""
        return (max(self.values) - min(self.values)) / self.median if self.median else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": min(self.values),
            "max": max(self.values),
            "spread": self.spread,
            "n": len(self.values),
        }


def interleave(contenders: Mapping[str, Contender], repeats: int, warmup: int = 0) -> dict[str, Samples]:
    """Run every contender once per round for ``repeats`` rounds (after ``warmup`` untimed rounds).

    Round ``r`` starts with contender ``r mod n``, so no contender always runs first (or always
    right after the same neighbour)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(contenders)
    values: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            t0 = time.perf_counter()
            measured = contenders[name]()
            seconds = time.perf_counter() - t0 if measured is None else float(measured)
            if r >= warmup:
                values[name].append(seconds)
    return {name: Samples(tuple(v)) for name, v in values.items()}


def ratio(samples: Mapping[str, Samples], baseline: str, other: str) -> dict[str, Any]:
    """How many times faster ``other`` is than ``baseline``: median over median, and the range of
    the per-round ratios (round ``r`` of the baseline against round ``r`` of ``other``)."""
    base, mine = samples[baseline], samples[other]
    paired = [b / o for b, o in zip(base.values, mine.values) if o > 0]
    return {
        "median": base.median / mine.median if mine.median else float("inf"),
        "paired_min": min(paired) if paired else None,
        "paired_max": max(paired) if paired else None,
        "baseline": baseline,
    }


def median_of(samples: Mapping[str, Samples]) -> dict[str, float]:
    """name -> median seconds (for compact tables)."""
    return {name: s.median for name, s in samples.items()}


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by every thread of ``pid`` (nanosecond scheduler accounting, far finer
    than the 10 ms ticks of /proc/PID/stat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
