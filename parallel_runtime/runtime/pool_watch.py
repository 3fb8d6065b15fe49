"""The host's periodic judgement of a running pool (called from its monitor thread).

* Hung ranks (:class:`~.watchdog.Watchdog` over the pulse rows and the kernel's process states):
  a :class:`WorkerHung` naming the rank. Before a stalled rank is torn down it is asked to print
  its Python stacks (SIGUSR1, faulthandler), which then appear in the error's log lines.
* A job that failed on one rank while others have not finished: if every unfinished rank waits
  in a collective, they wait for the failed rank forever, so the pool is torn down at once;
  otherwise after the error grace period.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from ..errors import PoolAborted, WorkerHung
from .control import ControlBlock
from .futures import JobFuture
from .watchdog import Verdict, Watchdog, WatchdogSettings, proc_state

log = logging.getLogger(__name__)

STACK_DUMP_WAIT_S = 0.3  # time for a stalled rank to print its stacks before it is killed


class PoolWatch:
    def __init__(
        self,
        settings: WatchdogSettings,
        control: ControlBlock,
        procs: Sequence[subprocess.Popen],
        logs: Sequence[collections.deque],
    ):
        self.settings, self.control, self.procs, self.logs = settings, control, procs, logs
        self.watchdog = Watchdog(settings, len(procs))
        self._next_check = 0.0

    def check(self, jobs: Sequence[JobFuture]) -> BaseException | None:
        """The failure that must end the pool now, if any (at most every ``check_s``)."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.settings.check_s
        pulses = self.control.pulses()
        busy = {r for fut in jobs for r in fut._pending_ranks}
        states = [proc_state(p.pid) for p in self.procs]
        verdict = self.watchdog.check(time.monotonic_ns(), pulses, states, busy)
        if verdict is not None:
            return self._hung(verdict)
        for fut in jobs:
            if fut.error is None or fut.error_deadline is None or not fut._pending_ranks:
                continue
            pending = [p for p in pulses if p.rank in fut._pending_ranks]
            if self.watchdog.all_waiting(pending, time.monotonic_ns()) or now > fut.error_deadline:
                log.warning(
                    "job '%s' failed on one rank and rank(s) %s cannot finish (waiting in a collective); "
                    "restarting the pool",
                    fut.name,
                    sorted(fut._pending_ranks),
                )
                return PoolAborted(
                    f"the pool was restarted because job '{fut.name}' failed on one rank and the others "
                    f"(ranks {sorted(fut._pending_ranks)}) could not finish"
                )
        return None

    def _hung(self, verdict: Verdict) -> WorkerHung:
        lines: list[str] = []
        if verdict.rank is not None:
            if verdict.kind == "stalled":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.procs[verdict.rank].pid, signal.SIGUSR1)  # faulthandler: print the stacks
                time.sleep(STACK_DUMP_WAIT_S)
            lines = list(self.logs[verdict.rank])
        log.error("%s; tearing the pool down", verdict.describe())
        return WorkerHung(verdict.rank, verdict.describe(), lines)

    @property
    def interval_s(self) -> float | None:
        """The measured time between progress points (a step, a patch), once known."""
        return self.watchdog.interval_s
