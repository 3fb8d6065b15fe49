"""JobFuture: the pending result of one job, and the ways a caller waits for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..errors import JobCancelled, RuntimeTimeout

EventCallback = Callable[[int, str, Any], None]  # (rank, kind, payload)


class JobRunner(Protocol):
    """What a future needs of the pool running its job (running.RunningPool); named here so that
    this module does not import the pool that imports it."""

    closed: bool

    def waiting(self) -> AbstractContextManager[None]: ...
    def drain(self) -> bool: ...
    def wait_for_messages(self, timeout: float) -> None: ...
    def request_cancel(self, job_id: int) -> None: ...
    def abort(self, reason: str) -> None: ...


class JobFuture:
    """The pending result of a job. ``result()`` returns the chosen rank's return value."""

    def __init__(
        self, job_id: int, name: str, world: int, result_rank: int | str, default_timeout: float, runtime: JobRunner
    ):
        self.job_id, self.name, self.result_rank = job_id, name, result_rank
        self._default_timeout = default_timeout
        self._runtime = runtime
        self._world = world
        self._done = threading.Event()
        self._pending_ranks = set(range(world))
        self._values: dict[int, Any] = {}
        self.status: str | None = None  # "ok" | "error" | "cancelled"
        self.error: BaseException | None = None
        self.on_event: EventCallback | None = None
        self.error_deadline: float | None = None

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Ask every rank to stop at its next safe point; the job then ends 'cancelled'."""
        if not self.done():
            self._runtime.request_cancel(self.job_id)

    def _wait_until(self, deadline: float) -> bool:
        """Drain the workers' rings from this thread until the job is done or ``deadline`` passes.

        The caller waits on the workers' doorbells itself: one thread hand-over less than waiting
        for the event thread (spinning instead was measured slower: it steals the workers' CPU).
        The event thread still delivers events and detects deaths."""
        rt = self._runtime
        with rt.waiting():
            while not self._done.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or rt.closed:
                    break
                rt.drain()
                if self._done.is_set():
                    break
                rt.wait_for_messages(min(left, 0.05))
        return self._done.wait(max(deadline - time.monotonic(), 0.0) if not rt.closed else 1.0)

    def result(self, timeout: float | None = None) -> Any:
        """The result (see the class doc); RuntimeTimeout after ``timeout`` seconds, leaving the job
        running. Interactive callers want :meth:`wait`, which never leaves the pool wedged."""
        timeout = self._default_timeout if timeout is None else timeout
        if not self._wait_until(time.monotonic() + timeout):
            raise RuntimeTimeout(
                f"job '{self.name}' (id {self.job_id}) did not finish within {timeout:.1f} s; "
                f"ranks still running: {sorted(self._pending_ranks)}. Cancel it with future.cancel() or close the pool."
            )
        if self.error is not None:
            raise self.error
        if self.result_rank == "all":
            return [self._values.get(r) for r in range(self._world)]
        return self._values.get(self.result_rank)

    def wait(
        self,
        should_cancel: Callable[[], bool] | None = None,
        timeout: float | None = None,
        cancel_grace_s: float = 60.0,
        poll_s: float = 0.1,
    ) -> Any:
        """Wait for the result as an interactive caller should: cancel the job once
        ``should_cancel()`` returns True (checked every ``poll_s``), and if the job ignores the
        cancel for ``cancel_grace_s`` or runs past ``timeout``, restart the workers so that the
        next job does not queue behind it. Raises JobCancelled or RuntimeTimeout then. A
        KeyboardInterrupt while waiting cancels the job before it propagates."""
        try:
            return self._wait(should_cancel, timeout, cancel_grace_s, poll_s)
        except KeyboardInterrupt:
            # Ctrl-C: stop the job too (it would keep the workers busy), briefly wait for it to stop.
            self.cancel()
            self._wait_until(time.monotonic() + 1.0)
            raise

    def _wait(self, should_cancel, timeout, cancel_grace_s, poll_s) -> Any:
        timeout = self._default_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        cancel_deadline: float | None = None
        while not self._wait_until(min(time.monotonic() + poll_s, deadline, cancel_deadline or deadline)):
            now = time.monotonic()
            if cancel_deadline is None and should_cancel is not None and should_cancel():
                self.cancel()
                cancel_deadline = now + cancel_grace_s
            elif cancel_deadline is not None and now >= cancel_deadline:
                why = f"it did not stop within {cancel_grace_s:.0f} s of being cancelled"
                self._runtime.abort(f"job '{self.name}' (id {self.job_id}) was abandoned: {why}")
                raise JobCancelled(
                    f"job '{self.name}' was cancelled; {why}, so the workers were restarted "
                    "(the next job starts a fresh pool and reloads the model)"
                )
            elif now >= deadline:
                self._runtime.abort(f"job '{self.name}' (id {self.job_id}) ran past its {timeout:.0f} s limit")
                raise RuntimeTimeout(
                    f"job '{self.name}' (id {self.job_id}) did not finish within {timeout:.0f} s (ranks still "
                    f"running: {sorted(self._pending_ranks)}), so the workers were restarted; the next job "
                    "starts a fresh pool. Raise the job timeout if such long jobs are expected."
                )
        return self.result(0)

    # called by the runtime --------------------------------------------------------------------
    def _finish(self, status: str, error: BaseException | None = None) -> None:
        if not self._done.is_set():
            self.status, self.error = status, error
            self._done.set()
