"""The CLI's progress line: one line per job, as far as the slowest rank, with its rate and time left;
redrawn in place on a terminal, one line per step in a log."""

from __future__ import annotations

import io

from parallel_runtime.tools.progress_line import ProgressLine


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _steps(line: ProgressLine, clock: Clock, ranks: int, total: int) -> None:
    """Every rank reports every step (as a Ulysses / CFG job's ranks do), rank 1 always last."""
    for step in range(1, total + 1):
        clock.now += 0.5
        for rank in range(ranks):
            line.on_event(rank, "progress", {"step": step, "total": total})
            line.on_event(rank, "memory", {"rss": 1})  # other events: not progress


def test_a_log_gets_one_line_per_step_from_the_slowest_rank():
    out, clock = io.StringIO(), Clock()
    line = ProgressLine(out, ranks=2, clock=clock)
    _steps(line, clock, ranks=2, total=4)
    line.finish()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 4  # not one per rank's report (8)
    for k, got in enumerate(lines, start=1):
        assert got.startswith(f"sampling step {k}/4  2 steps/s"), got
    assert "ETA 1.0 s" in lines[1] and "took 2.0 s" in lines[-1]


def test_the_line_waits_for_the_slowest_rank():
    out, clock = io.StringIO(), Clock()
    line = ProgressLine(out, ranks=2, clock=clock)
    clock.now += 1.0
    line.on_event(0, "progress", {"step": 1, "total": 3})
    line.on_event(0, "progress", {"step": 2, "total": 3})
    assert out.getvalue() == ""  # rank 1 has not finished a step
    line.on_event(1, "progress", {"step": 1, "total": 3})
    assert out.getvalue().splitlines() == ["sampling step 1/3  1 steps/s  ETA 2.0 s  (slowest: rank 1)"]


def test_pipefusion_patches_show_inside_a_step_on_a_terminal():
    out, clock = io.StringIO(), Clock()
    line = ProgressLine(out, ranks=2, clock=clock, tty=True)
    clock.now += 1.0
    for rank in (0, 1):  # a warmup step (the whole image: one report, the step done)
        line.on_event(rank, "progress", {"step": 1, "total": 3, "patches": 4, "patch": 0})
    for patch in range(3):  # step 2, patches 0..2 of 4 on both ranks
        clock.now += 0.25
        for rank in (0, 1):
            line.on_event(rank, "progress", {"step": 1, "total": 3, "patches": 4, "patch": patch})
    assert line.text().startswith("sampling step 1/3 patch 3/4 (of step 2)")
    line.on_event(0, "progress", {"step": 2, "total": 3, "patches": 4, "patch": 3})
    assert "patch 3/4 (of step 2)" in line.text() and "rank 1" in line.text()  # rank 1 is behind
    line.on_event(1, "progress", {"step": 2, "total": 3, "patches": 4, "patch": 3})
    assert line.text().startswith("sampling step 2/3  ")
    line.finish()
    text = out.getvalue()
    redraws = text.split("\r")[1:]
    assert len(redraws) >= 5 and text.endswith("\n") and text.count("\n") == 1  # one line, redrawn in place
    assert all(r.rstrip("\n").endswith("\x1b[K") for r in redraws)  # the rest of a longer old line is cleared


def test_a_log_is_not_written_per_patch():
    out, clock = io.StringIO(), Clock()
    line = ProgressLine(out, ranks=1, clock=clock)
    for step in range(2):
        for patch in range(4):
            clock.now += 0.1
            done = step + 1 if patch == 3 else step
            line.on_event(0, "progress", {"step": done, "total": 2, "patches": 4, "patch": patch})
    assert [x.split("  ")[0] for x in out.getvalue().splitlines()] == ["sampling step 1/2", "sampling step 2/2"]
