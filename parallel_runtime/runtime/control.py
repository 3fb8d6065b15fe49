"""The pool's control block: one small shared-memory segment the host and every worker map.

Layout (little-endian int64 fields):

* a cancel table of ``CANCEL_SLOTS`` entries: cancelling job ``j`` stores ``j`` at ``j % CANCEL_SLOTS``.
  Entries are never cleared (job ids are unique and increase), so cancelling one job never erases
  another's request and nothing races at the end of a job. A worker is never more than the command
  ring's length behind the host, far fewer than ``CANCEL_SLOTS`` jobs, so a slot is not reused while
  its job can still run.
* one "pulse" row per rank, written by that rank and read by the host's watchdog:
  the job it runs, a progress counter and when it last moved, a heartbeat, and what its main thread
  is doing (idle / computing / waiting on peers) since when.

Each field has a single writer; an aligned 8-byte store is not torn on the CPUs we run on, and
the watchdog only compares values over time, so no fence is needed here.
"""

from __future__ import annotations

import dataclasses
import struct
import time

from .segments import Segment

CANCEL_SLOTS = 256
_CANCEL_OFFSET = 64
_PULSE_OFFSET = _CANCEL_OFFSET + 8 * CANCEL_SLOTS
_ROW = 64
_Q = struct.Struct("<q")

# pulse row fields (byte offsets within a rank's row)
JOB, PROGRESS, PROGRESS_NS, BEAT_NS, STATE, STATE_SINCE_NS = 0, 8, 16, 24, 32, 40
IDLE, COMPUTING, WAITING = 0, 1, 2
STATE_NAMES = {IDLE: "idle", COMPUTING: "computing", WAITING: "waiting on its peers"}
NO_JOB = -1


@dataclasses.dataclass(frozen=True)
class Pulse:
    """One rank's row as read by the host."""

    rank: int
    job_id: int
    progress: int
    progress_ns: int
    beat_ns: int
    state: int
    state_since_ns: int


class ControlBlock:
    """Cancel table and pulse rows over a :class:`Segment` (created by the host, attached by workers)."""

    def __init__(self, segment: Segment, world: int):
        self.segment, self.world = segment, world
        self.mm = segment.mm

    @staticmethod
    def size(world: int) -> int:
        return _PULSE_OFFSET + _ROW * world

    @classmethod
    def create(cls, name: str, world: int) -> ControlBlock:
        block = cls(Segment.create(name, cls.size(world)), world)
        for slot in range(CANCEL_SLOTS):
            _Q.pack_into(block.mm, _CANCEL_OFFSET + 8 * slot, NO_JOB)
        now = time.monotonic_ns()
        for rank in range(world):
            block.write(rank, JOB, NO_JOB)
            block.write(rank, STATE_SINCE_NS, now)
        return block

    @classmethod
    def attach(cls, name: str, world: int) -> ControlBlock:
        return cls(Segment.attach(name), world)

    # cancel ---------------------------------------------------------------------------------------
    def request_cancel(self, job_id: int) -> None:
        _Q.pack_into(self.mm, _CANCEL_OFFSET + 8 * (job_id % CANCEL_SLOTS), job_id)

    def is_cancelled(self, job_id: int) -> bool:
        if job_id < 0:
            return False
        (value,) = _Q.unpack_from(self.mm, _CANCEL_OFFSET + 8 * (job_id % CANCEL_SLOTS))
        return value == job_id

    # pulse ----------------------------------------------------------------------------------------
    def write(self, rank: int, field: int, value: int) -> None:
        _Q.pack_into(self.mm, _PULSE_OFFSET + _ROW * rank + field, value)

    def read(self, rank: int, field: int) -> int:
        return _Q.unpack_from(self.mm, _PULSE_OFFSET + _ROW * rank + field)[0]

    def pulse(self, rank: int) -> Pulse:
        base = _PULSE_OFFSET + _ROW * rank
        values = struct.unpack_from("<6q", self.mm, base)
        return Pulse(rank, *values)

    def pulses(self) -> list[Pulse]:
        return [self.pulse(r) for r in range(self.world)]

    def close(self, unlink: bool = False) -> None:
        if unlink:
            self.segment.unlink()
        self.segment.close()


class ProgressRecorder:
    """Worker side: the main thread's writes to its own pulse row."""

    def __init__(self, block: ControlBlock, rank: int):
        self.block, self.rank = block, rank
        self.count = 0

    def job_started(self, job_id: int) -> None:
        self.block.write(self.rank, JOB, job_id)
        self.tick()

    def job_ended(self) -> None:
        self.tick()
        self.block.write(self.rank, JOB, NO_JOB)

    def tick(self) -> None:
        """A progress point: a step, a patch, an event, a loaded component."""
        self.count += 1
        self.block.write(self.rank, PROGRESS_NS, time.monotonic_ns())
        self.block.write(self.rank, PROGRESS, self.count)
