"""JobTable: a running pool's pending jobs, and how the workers' events and results settle them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import JobCancelled, ProtocolError, WorkerError, explain
from .futures import JobFuture
from .protocol import Event, Result
from .shm import Undecodable

log = logging.getLogger(__name__)


class JobTable:
    """Futures of the jobs sent and not yet finished on every rank, by job id.

    ``peer_died(message)``: whether a rank's error is the symptom of another rank's death (then the
    death is the job's error); ``cancel(job_id)``: stop a job on the workers."""

    def __init__(self, error_grace_s: float, peer_died: Callable[[str], bool], cancel: Callable[[int], None]):
        self.error_grace_s = error_grace_s
        self.peer_died, self.cancel = peer_died, cancel
        self.lock = threading.Lock()
        self._jobs: dict[int, JobFuture] = {}
        self._next_id = 1
        self._undecodable_logged: set[tuple[int, str]] = set()

    def add(self, make: Callable[[int], JobFuture]) -> JobFuture:
        """Register the future ``make(job_id)`` under a new job id."""
        with self.lock:
            fut = make(self._next_id)
            self._next_id += 1
            self._jobs[fut.job_id] = fut
        return fut

    def get(self, job_id: int) -> JobFuture | None:
        return self._jobs.get(job_id)

    def remove(self, job_id: int) -> None:
        with self.lock:
            self._jobs.pop(job_id, None)

    def pending(self) -> list[JobFuture]:
        return list(self._jobs.values())

    def fail_all(self, error: BaseException) -> None:
        """Every pending job ends with ``error`` (the pool is going away)."""
        with self.lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
        for fut in jobs:
            fut._finish("error", error)

    def settling(self) -> bool:
        """A job failed on one rank while others still run it: the pool may be torn down any moment."""
        return any(f.error_deadline is not None and f._pending_ranks for f in self.pending())

    # -- messages ---------------------------------------------------------------------------------
    def event(self, msg: Event) -> None:
        fut = self._jobs.get(msg.job_id)
        if fut is not None and fut.on_event is not None:
            try:
                fut.on_event(msg.rank, msg.kind, msg.payload)
            except Exception:
                log.exception("event callback of job %s raised", msg.job_id)

    def result(self, msg: Result) -> None:
        fut = self._jobs.get(msg.job_id)
        if fut is None:
            return
        fut._pending_ranks.discard(msg.rank)
        if msg.status == "ok":
            fut._values[msg.rank] = msg.value
        elif msg.status == "error":
            err = msg.error
            if err.type == "PeerFailed" and fut._pending_ranks:
                return  # a symptom: the failing rank's own error is on its way
            if self.peer_died(err.message):
                return  # the death itself is the error; the process check has failed the job
            if fut.error is None:
                fut._finish("error", WorkerError(fut.name, msg.rank, err.type, err.message, err.traceback))
                fut.error_deadline = time.monotonic() + self.error_grace_s
        elif msg.status == "cancelled":
            if not fut.done():
                fut._finish("cancelled", JobCancelled(f"job '{fut.name}' (id {msg.job_id}) was cancelled"))
        else:
            raise ProtocolError(
                f"rank {msg.rank} ended job {msg.job_id} with status {msg.status!r}",
                "a job ends 'ok', 'error' or 'cancelled'",
                "restart the program that runs dit-parallel (host and worker code differ?)",
            )
        if not fut._pending_ranks:
            if not fut.done():
                fut._finish("ok")
            self.remove(msg.job_id)

    def undecodable(self, rank: int, msg: Undecodable) -> None:
        """A message from ``rank`` that could not be decoded (already consumed): fail its job. One
        that belongs to no job (a READY, an unknown kind) is a ProtocolError: the pool cannot go on."""
        if msg.kind not in (Event.TAG, Result.TAG):
            raise ProtocolError(
                f"rank {rank} sent a message of kind {msg.kind} that the host cannot decode ({msg.error})",
                "every message of a worker's start and every kind the host does not know comes from other code "
                "than the host's (or a bug)",
                "restart the program that runs dit-parallel",
            )
        key = (rank, msg.error.split(":", 1)[0])
        if key not in self._undecodable_logged:  # once per rank and kind of error, not per message
            self._undecodable_logged.add(key)
            log.error("could not decode a message from rank %d (job %s): %s", rank, msg.job_id, msg.error)
        fut = self._jobs.get(msg.job_id)
        if fut is None:
            return
        if msg.kind == Result.TAG:
            fut._pending_ranks.discard(rank)
        what = "result" if msg.kind == Result.TAG else "event"
        err = WorkerError(
            fut.name,
            rank,
            "UndecodableMessage",
            explain(
                f"the {what} rank {rank} sent could not be decoded on the host ({msg.error})",
                "the host unpickles what a job returns or emits, so every class in it must be importable on "
                "the host too",
                "return or emit tensors and plain data (numbers, strings, lists, dicts), or objects of classes "
                "defined in modules both sides import",
            ),
            "",
        )
        fut._finish("error", err)  # no grace deadline: the ranks are healthy and finish on their own
        if not fut._pending_ranks:
            self.remove(msg.job_id)
        elif what == "event":
            self.cancel(msg.job_id)  # nobody waits for the rest of it
