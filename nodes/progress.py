"""Run a runtime job while the node's own thread feeds ComfyUI: progress bar, previews, cancel.

The runtime calls ``on_event`` from its monitor thread, but ComfyUI must be called from the
thread executing the node (it finds the node through a context variable, and its progress hook
raises on interrupt in the calling thread). So the job runs in a helper thread, events are queued,
and the node thread drains them, updates ComfyUI, and polls the interrupt flag; ``should_cancel``
only reads an Event that the node thread sets.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .bridge import Bridge
from .status import StatusBoard

T = TypeVar("T")
EventFn = Callable[[int, str, Any], None]


class JobMonitor:
    """Turns runtime events into ComfyUI progress/previews and status-panel events.

    ComfyUI's progress bar moves once per step, when the slowest of the ``ranks`` workers has
    finished it (one "progress" message per step); the preview of the step reached (a uint8 RGB
    picture the preview rank made) rides along with that update. Previews are kept by step: the
    preview rank may run a step ahead of the slowest rank, and its next preview must not replace
    the one of the step being shown. Every rank's own progress and memory go to the status panel."""

    def __init__(self, bridge: Bridge, status: StatusBoard, pool: str, total: int, ranks: int = 1):
        self.bridge, self.status, self.pool = bridge, status, pool
        self.total = max(int(total), 1)
        self.bar = bridge.progress_bar(self.total)
        self.rank_step: dict[int, int] = dict.fromkeys(range(max(int(ranks), 1)), 0)
        self.shown = 0
        self.previews = 0
        self._pending_previews: dict[int, Any] = {}  # step -> preview picture not shown yet
        self.cache_summaries: list[dict] = []  # what rank 0's step / block caches did (a "cache" event)

    def handle(self, rank: int, kind: str, payload: Any) -> None:
        if kind == "cache" and rank == 0 and isinstance(payload, list):
            self.cache_summaries = payload
            return
        payload = payload if isinstance(payload, dict) else {}
        if kind == "progress":
            self.status.progress(self.pool, rank, payload)
            if "step" in payload:
                self.total = int(payload.get("total") or self.total)
                self.rank_step[rank] = max(self.rank_step.get(rank, 0), int(payload["step"]))
                self._advance()
        elif kind == "preview" and payload.get("image") is not None:
            step = int(payload.get("step") or self.shown + 1)
            if step > self.shown:
                self._pending_previews[step] = payload["image"]
        elif kind == "memory":
            self.status.memory(self.pool, rank, payload)

    def _advance(self) -> None:
        done = min(min(self.rank_step.values()), self.total)
        if done <= self.shown:
            return
        self.shown = done
        reached = [step for step in self._pending_previews if step <= done]
        image = self._pending_previews[max(reached)] if reached else None
        for step in reached:
            del self._pending_previews[step]
        if image is not None:
            self.previews += 1
        self.bar.update_absolute(done, self.total, image)


def run_with_events(
    job: Callable[[EventFn, Callable[[], bool]], T],
    on_event: EventFn,
    bridge: Bridge,
    poll_s: float = 0.05,
) -> T:
    """Run ``job(on_event, should_cancel)`` in a helper thread; deliver its events to
    ``on_event`` on this thread; cancel it when ComfyUI's interrupt flag is raised. An exception
    raised while handling an event (ComfyUI's progress hook raises on interrupt) cancels the job
    and is re-raised once it has stopped, unless the job itself failed."""
    events: queue.SimpleQueue = queue.SimpleQueue()
    cancel = threading.Event()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = job(lambda rank, kind, payload: events.put((rank, kind, payload)), cancel.is_set)
        except BaseException as exc:  # handed to the node thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="dit-parallel-job", daemon=True)
    thread.start()
    handler_error: BaseException | None = None
    while thread.is_alive() or not events.empty():
        try:
            event = events.get(timeout=poll_s)
        except queue.Empty:
            event = None
        if event is not None and handler_error is None:
            try:
                on_event(*event)
            except BaseException as exc:
                handler_error = exc
                cancel.set()
        if not cancel.is_set() and bridge.interrupted():
            cancel.set()
    thread.join()
    if "error" in outcome:
        error = outcome["error"]
        if handler_error is not None and _is_cancel(error):
            raise handler_error from error
        raise error
    if handler_error is not None:
        raise handler_error
    return outcome["value"]


def _is_cancel(exc: BaseException) -> bool:
    from parallel_runtime.errors import JobCancelled

    return isinstance(exc, JobCancelled)
