"""The CLI's one progress line per job: the slowest rank's step (and, with PipeFusion, its patch), the
rate and the time left.

Every rank reports its own progress (``"progress"`` events: ``step`` = steps that rank has finished,
``total``; with PipeFusion also after each patch: ``patch`` (its band index) and ``patches``). The job is
as far as its slowest rank. On a terminal the line is redrawn in place; into a file or a pipe (a log) it
is printed once per finished step, never with carriage returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

CLEAR_TO_END = "\x1b[K"


class ProgressLine:
    """Feed it the job's events (``on_event(rank, kind, payload)``, the runtime's callback); call
    :meth:`finish` when the job ends. ``ranks``: how many ranks report (a rank that has not reported yet
    counts as being at the start)."""

    def __init__(
        self,
        stream: TextIO,
        ranks: int,
        label: str = "sampling",
        clock: Callable[[], float] = time.monotonic,
        tty: bool | None = None,
    ):
        self.stream, self.label, self.clock = stream, label, clock
        self.tty = _is_tty(stream) if tty is None else tty
        self.positions: dict[int, float] = dict.fromkeys(range(max(int(ranks), 1)), 0.0)
        self._done: dict[int, int] = {}  # each rank's finished steps, as last reported
        self._patch: dict[int, tuple[int, int]] = {}  # a rank inside a step: (patches done, patches)
        self.total = 0
        self.started = clock()
        self.printed_steps = 0  # the last step printed (not a terminal)
        self._drawn = ""

    def on_event(self, rank: int, kind: str, payload: Any) -> None:
        if kind != "progress" or not isinstance(payload, dict) or "step" not in payload:
            return
        done, total = int(payload["step"]), int(payload.get("total") or self.total)
        self.total = max(self.total, total)
        patches = int(payload.get("patches") or 1)
        previous = self._done.get(rank, 0)
        self._done[rank] = max(previous, done)
        if "patch" in payload and patches > 1 and done <= previous:
            # a patch inside step ``done + 1`` (the step's last patch reports the step finished instead)
            inside = min(int(payload["patch"]) + 1, patches - 1)
            self._patch[rank] = (inside, patches)
            position = done + inside / patches
        else:
            self._patch.pop(rank, None)
            position = float(done)
        self.positions[rank] = max(self.positions.get(rank, 0.0), position)
        self._show()

    def slowest(self) -> int:
        """The rank furthest behind (the lowest rank of those equally far)."""
        return min(self.positions, key=lambda r: (self.positions[r], r))

    def text(self) -> str:
        """The line as it reads now, e.g. ``sampling step 3/12 patch 2/4 (of step 4)  1.85 steps/s  ETA 5 s``."""
        rank = self.slowest()
        position = self.positions[rank]
        steps = int(position)
        parts = [f"{self.label} step {steps}/{self.total}"]
        if rank in self._patch and position > steps:
            inside, patches = self._patch[rank]
            parts[0] += f" patch {inside}/{patches} (of step {steps + 1})"
        elapsed = self.clock() - self.started
        if position > 0 and elapsed > 0:
            rate = position / elapsed
            parts.append(f"{rate:.3g} steps/s")
            left = max(self.total - position, 0.0) / rate
            parts.append(f"ETA {_duration(left)}" if left > 0 else f"took {_duration(elapsed)}")
        if len(self.positions) > 1:
            parts.append(f"(slowest: rank {rank})")
        return "  ".join(parts)

    def _show(self) -> None:
        if self.tty:
            line = self.text()
            if line != self._drawn:
                self.stream.write(f"\r{line}{CLEAR_TO_END}")
                self.stream.flush()
                self._drawn = line
            return
        steps = int(min(self.positions.values()))
        if steps > self.printed_steps:
            self.printed_steps = steps
            self.stream.write(self.text() + "\n")
            self.stream.flush()

    def finish(self) -> None:
        """End the line (a terminal's cursor moves to the next line)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = ""


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
