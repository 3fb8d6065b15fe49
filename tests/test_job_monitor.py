"""The Parallel Sampler's ComfyUI progress: one bar update per step once the slowest rank has finished it,
carrying that step's preview — even when the preview rank runs a step ahead of the others (it did, under
load, and its next preview replaced the one of the step being shown: a step went without a picture)."""

from __future__ import annotations

from typing import Any

from nodes.progress import JobMonitor
from nodes.status import StatusBoard


class _Bar:
    def __init__(self) -> None:
        self.updates: list[tuple[int, Any]] = []

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        self.updates.append((value, preview))


class _Bridge:
    def __init__(self) -> None:
        self.bar = _Bar()

    def progress_bar(self, total: int) -> _Bar:
        return self.bar

    def send_status(self, payload: dict[str, Any]) -> None:
        pass


def _monitor(ranks: int) -> tuple[JobMonitor, _Bar]:
    bridge = _Bridge()
    return JobMonitor(bridge, StatusBoard(bridge), "pool", total=3, ranks=ranks), bridge.bar


def _preview(monitor: JobMonitor, step: int) -> None:
    monitor.handle(0, "preview", {"step": step, "total": 3, "image": f"picture {step}"})


def _progress(monitor: JobMonitor, rank: int, step: int) -> None:
    monitor.handle(rank, "progress", {"step": step, "total": 3})


def test_each_step_shows_its_own_preview_when_the_preview_rank_runs_ahead():
    monitor, bar = _monitor(ranks=2)
    for step in (1, 2, 3):  # rank 0 (the preview rank) finishes every step before rank 1 finishes any
        _preview(monitor, step)
        _progress(monitor, 0, step)
    assert bar.updates == []  # the bar waits for the slowest rank
    for step in (1, 2, 3):
        _progress(monitor, 1, step)
    assert bar.updates == [(1, "picture 1"), (2, "picture 2"), (3, "picture 3")]
    assert monitor.previews == 3


def test_a_jump_over_several_steps_shows_the_newest_preview_reached_and_none_twice():
    monitor, bar = _monitor(ranks=2)
    for step in (1, 2):
        _preview(monitor, step)
        _progress(monitor, 0, step)
    _preview(monitor, 3)
    _progress(monitor, 1, 2)  # the slowest rank reports step 2 first: the bar jumps 0 -> 2
    _progress(monitor, 0, 3)
    _progress(monitor, 1, 3)
    assert bar.updates == [(2, "picture 2"), (3, "picture 3")]


def test_one_rank_shows_every_step_with_its_preview():
    monitor, bar = _monitor(ranks=1)
    for step in (1, 2, 3):
        _preview(monitor, step)
        _progress(monitor, 0, step)
    assert bar.updates == [(1, "picture 1"), (2, "picture 2"), (3, "picture 3")]
