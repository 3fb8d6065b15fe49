"""Hung-rank detection: a rank that stops making progress becomes an error naming it.

Worker side, :class:`Heartbeat`: a daemon thread writes a heartbeat into the rank's pulse row
(control.py) and classifies what the main thread is doing from its innermost Python frame: inside
``torch.distributed`` or our collectives module it is *waiting* on its peers, anywhere else it is
*computing*, between jobs *idle*. Every wait on a peer in this code base goes through one of those
two modules (ring attention, VAE halos and PipeFusion's transport all call collectives.py).

Host side, :class:`Watchdog` (pure logic over readings; the monitor thread feeds it):

1. a rank the kernel reports stopped (``T``/``t`` in /proc: SIGSTOP, job control, a debugger) for
   ``stopped_s`` -> hung;
2. a rank whose heartbeat is older than ``heartbeat_s`` -> frozen (the whole process, e.g. a cgroup
   freezer, or the interpreter lock held in C code);
3. during a job, a rank *computing* without progress for the stall bound while another rank *waits*
   for it -> that rank stalls (a driver hang, a dead loop); every rank *waiting* that long -> no
   rank arrives (a lost link).

The stall bound scales with the pool's measured progress interval (a step, a PipeFusion patch):
``max(stall_min_s, stall_factor x interval)``, or ``stall_first_s`` before anything was measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time

from .control import BEAT_NS, COMPUTING, IDLE, JOB, NO_JOB, STATE, STATE_SINCE_NS, WAITING, ControlBlock, Pulse

WAIT_MODULES: tuple[str, ...] = ("torch.distributed", "parallel_runtime.parallel.collectives")
"""A main thread whose innermost Python frame is in one of these modules is waiting on its peers."""


@dataclasses.dataclass(frozen=True)
class WatchdogSettings:
    """How long each kind of silence may last before the rank is declared hung (seconds)."""

    stopped_s: float = 1.0
    heartbeat_s: float = 60.0
    stall_factor: float = 20.0
    stall_min_s: float = 60.0
    stall_first_s: float = 600.0
    beat_s: float = 0.25  # worker heartbeat period
    check_s: float = 0.25  # host check period

    def stall_bound(self, interval_s: float | None) -> float:
        if interval_s is None:
            return max(self.stall_first_s, self.stall_min_s)
        return max(self.stall_min_s, self.stall_factor * interval_s)


# -- worker side -----------------------------------------------------------------------------------


def classify_frame(frame) -> int:
    """WAITING if the innermost frame runs in one of WAIT_MODULES, else COMPUTING."""
    if frame is None:
        return COMPUTING
    module = frame.f_globals.get("__name__", "") or ""
    return WAITING if module.startswith(WAIT_MODULES) else COMPUTING


class Heartbeat:
    """The worker's heartbeat thread (see the module doc). ``start()`` once; it dies with the process."""

    def __init__(self, block: ControlBlock, rank: int, period_s: float):
        self.block, self.rank, self.period_s = block, rank, period_s
        self.main_ident = threading.main_thread().ident
        self._state = IDLE

    def beat(self) -> None:
        if self.block.read(self.rank, JOB) == NO_JOB:
            state = IDLE
        else:
            state = classify_frame(sys._current_frames().get(self.main_ident))
        now = time.monotonic_ns()
        if state != self._state:
            self._state = state
            self.block.write(self.rank, STATE_SINCE_NS, now)
            self.block.write(self.rank, STATE, state)
        self.block.write(self.rank, BEAT_NS, now)

    def _run(self) -> None:
        while True:
            with contextlib.suppress(ValueError, IndexError):  # the segment closed at exit
                self.beat()
            time.sleep(self.period_s)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="dpar-heartbeat", daemon=True)
        thread.start()
        return thread


# -- host side -------------------------------------------------------------------------------------


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, t, Z, ...); "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1].decode()
    except (OSError, IndexError):
        return ""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A hung pool: the rank to blame (None when no single rank is), what it did, for how long."""

    rank: int | None
    kind: str  # "stopped" | "frozen" | "stalled" | "no-arrival"
    seconds: float
    waiting_ranks: tuple[int, ...] = ()
    bound_s: float = 0.0

    def describe(self) -> str:
        waiters = ", ".join(map(str, self.waiting_ranks))
        if self.kind == "stopped":
            return f"rank {self.rank} is stopped (SIGSTOP, job control or a debugger) for {self.seconds:.1f} s"
        if self.kind == "frozen":
            return f"rank {self.rank} has not answered for {self.seconds:.0f} s (its whole process is frozen)"
        if self.kind == "stalled":
            return (
                f"rank {self.rank} made no progress for {self.seconds:.0f} s while rank(s) {waiters} waited for "
                f"it (limit {self.bound_s:.0f} s, from the measured step time)"
            )
        return f"every rank ({waiters}) has waited on the others for {self.seconds:.0f} s and none arrives"


class Watchdog:
    """Host-side judgement over successive readings of the pulse rows (see the module doc)."""

    def __init__(self, settings: WatchdogSettings, world: int):
        self.settings, self.world = settings, world
        self._stopped_since: dict[int, float] = {}
        self._last: dict[int, tuple[int, int, int]] = {}  # rank -> (job, progress, progress_ns)
        self.interval_s: float | None = None  # typical time between progress points

    def _learn(self, p: Pulse) -> None:
        """Learn the typical time between progress points from two readings of the same job (time
        between jobs, when the pool sits idle, is not a step)."""
        previous = self._last.get(p.rank)
        self._last[p.rank] = (p.job_id, p.progress, p.progress_ns)
        if previous is None or p.job_id == NO_JOB or previous[0] != p.job_id or p.progress <= previous[1]:
            return
        interval = (p.progress_ns - previous[2]) / 1e9 / (p.progress - previous[1])
        if interval > 0:
            # Follow slow phases at once, forget them slowly: the bound must cover the slowest step.
            if self.interval_s is None or interval > self.interval_s:
                self.interval_s = interval
            else:
                self.interval_s = 0.95 * self.interval_s + 0.05 * interval

    def check(self, now_ns: int, pulses: list[Pulse], states: list[str], busy: set[int]) -> Verdict | None:
        """``states``: /proc state per rank; ``busy``: ranks that have not finished the running job(s)."""
        s = self.settings
        now = now_ns / 1e9
        for p in pulses:
            self._learn(p)
        for rank, state in enumerate(states):
            if state in ("T", "t"):
                since = self._stopped_since.setdefault(rank, now)
                if now - since >= s.stopped_s:
                    return Verdict(rank, "stopped", now - since)
            else:
                self._stopped_since.pop(rank, None)
        for p in pulses:
            if p.beat_ns and (now_ns - p.beat_ns) / 1e9 > s.heartbeat_s:
                return Verdict(p.rank, "frozen", (now_ns - p.beat_ns) / 1e9)
        return self._stall(now_ns, [p for p in pulses if p.rank in busy])

    def _stall(self, now_ns: int, busy: list[Pulse]) -> Verdict | None:
        bound = self.settings.stall_bound(self.interval_s)
        waiting = [p for p in busy if p.state == WAITING and (now_ns - p.state_since_ns) / 1e9 > bound]
        if not waiting:
            return None
        waiters = tuple(p.rank for p in waiting)
        stuck = [
            p for p in busy if p.state == COMPUTING and (now_ns - max(p.progress_ns, p.state_since_ns)) / 1e9 > bound
        ]
        if stuck:
            worst = max(stuck, key=lambda p: now_ns - max(p.progress_ns, p.state_since_ns))
            seconds = (now_ns - max(worst.progress_ns, worst.state_since_ns)) / 1e9
            return Verdict(worst.rank, "stalled", seconds, waiters, bound)
        if len(waiting) == len(busy) == self.world:
            seconds = min((now_ns - p.state_since_ns) / 1e9 for p in waiting)
            return Verdict(None, "no-arrival", seconds, waiters, bound)
        return None

    def all_waiting(self, busy_pulses: list[Pulse], now_ns: int) -> bool:
        """Every still-busy rank has sat in a collective for a while (used when a job failed on
        another rank: they wait for a peer that will not come, so the pool is torn down at once).
        "A while" is three typical intervals, at least half a second: peers that merely pass
        through a collective of their own are not mistaken for stranded ones."""
        floor_s = max(0.5, 3 * (self.interval_s or 0.0))
        return bool(busy_pulses) and all(
            p.state == WAITING and (now_ns - p.state_since_ns) / 1e9 >= floor_s for p in busy_pulses
        )
