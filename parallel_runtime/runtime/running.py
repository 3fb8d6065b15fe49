"""RunningPool: the processes, shared-memory rings and monitor thread of one started WorkerPool.

Lifecycle: launch -> READY handshake -> jobs -> shutdown. The monitor thread (the event loop)
drains the workers' rings, resolves job futures and watches the processes: a dead worker, a hung
one (pool_watch.py) or a job failure that strands the other ranks fails every pending job with an
error naming the rank and tears the pool down; the WorkerPool then starts a fresh RunningPool on
the next submit. A message that cannot be decoded fails its job only.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any

from ..errors import (
    ConfigError,
    JobCancelled,
    PoolAborted,
    PoolClosed,
    RuntimeTimeout,
    WorkerDied,
    WorkerError,
    explain,
)
from ..parallel.config import ParallelConfig
from .affinity import allowed_cpus, plan_cpu_affinity
from .control import ControlBlock
from .futures import JobFuture
from .lifeline import make_death_pipe
from .pool_watch import PoolWatch
from .segments import SHM_DIR, SHM_SIZE_FIX, free_bytes, sweep_segments
from .shm import MESSAGE_KINDS, ShmRing, Undecodable, drain_doorbell, make_doorbell, ring_bytes
from .spawn import kill_and_reap, start_log_pump, start_worker
from .stale_pools import sweep_dead_hosts

log = logging.getLogger(__name__)


class RunningPool:
    """The processes, rings and monitor thread of one running pool (replaced after a death)."""

    def __init__(self, devices: list[str], config: ParallelConfig, opts: dict[str, Any]):
        self.devices, self.config, self.opts = devices, config, opts
        self.world = len(devices)
        self.prefix = f"dpar-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
        self.procs: list[subprocess.Popen] = []
        self.logs = [collections.deque(maxlen=200) for _ in devices]
        self.jobs: dict[int, JobFuture] = {}
        self.jobs_lock = threading.Lock()
        self.next_job_id = 1
        self.ready_info: dict[int, dict] = {}
        self.ready = threading.Event()
        self.dead: BaseException | None = None
        self.closed = False
        self.shutdown_lock = threading.Lock()
        self.shutdown_done = threading.Event()
        self.stop = threading.Event()
        self.evt_rings: list[ShmRing] = []
        self.evt_doorbells_r: list[int] = []
        self.cmd_doorbells_w: list[int] = []
        self.cmd: ShmRing | None = None
        self.control: ControlBlock | None = None  # cancel table and the ranks' pulse rows
        self.watch: PoolWatch | None = None
        self._process_check_lock = threading.Lock()
        self.undecodable_logged: set[tuple[int, str]] = set()
        self.private_dir: str | None = None  # 0700: the rendezvous store (no network listener)
        self.death_r: int | None = None
        self.death_w: int | None = None  # the death pipe's write end: closed when this process ends
        self.thread: threading.Thread | None = None
        self.log_threads: list[threading.Thread] = []
        self.waiters = 0  # threads waiting in JobFuture.result (they drain the rings themselves)
        self.drain_lock = threading.Lock()  # ring readers are single-consumer: one drainer at a time
        self.affinity: list[list[int] | None] = [None] * self.world

    # -- start ------------------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        removed = sweep_dead_hosts()  # what SIGKILLed hosts left (RAM-backed, there until a reboot)
        if removed:
            log.info("removed %d segment(s)/folder(s) of pools whose host died: %s", len(removed), removed[:8])
        try:
            self.private_dir = tempfile.mkdtemp(prefix=self.prefix + "private-")
            self.death_r, self.death_w = make_death_pipe()
            self._check_shared_memory()
            self.control = ControlBlock.create(self.prefix + "ctrl", self.world)
            self.cmd = ShmRing.create(self.prefix + "cmd", n_readers=self.world, fallback_dir=self.private_dir)
            child_fds: list[list[int]] = []
            for rank in range(self.world):
                evt = ShmRing.create(self.prefix + f"evt{rank}", n_readers=1, fallback_dir=self.private_dir)
                evt.reader_index = 0
                self.evt_rings.append(evt)
                cmd_r, cmd_w = make_doorbell()
                evt_r, evt_w = make_doorbell()
                self.cmd_doorbells_w.append(cmd_w)
                self.evt_doorbells_r.append(evt_r)
                child_fds.append([cmd_r, evt_w, self.death_r])
            self.cmd.set_doorbells(self.cmd_doorbells_w)
            if self.opts["pin_cpu_workers"]:
                self.affinity = plan_cpu_affinity(self.devices, self.opts["threads"], allowed_cpus())
            for rank, device in enumerate(self.devices):
                self.procs.append(self._launch(rank, device, child_fds[rank]))
                for fd in child_fds[rank][:2]:
                    os.close(fd)
            os.close(self.death_r)  # only the workers hold the read end
            self.death_r = None
            self.watch = PoolWatch(
                self.opts["watchdog"], self.control, self.procs, self.logs, self.opts["error_grace_s"]
            )
            self.thread = threading.Thread(target=self._event_loop, name=f"{self.prefix}events", daemon=True)
            self.thread.start()
            self._wait_ready()
        except BaseException:
            self.shutdown(graceful=False)
            raise
        log.info("pool %s started %d worker(s) in %.2f s", self.prefix, self.world, time.monotonic() - t0)

    def _launch(self, rank: int, device: str, fds: list[int]) -> subprocess.Popen:
        spec = {
            "rank": rank,
            "world_size": self.world,
            "device": device,
            "config": self.config.as_dict(),
            "threads": self.opts["threads"],
            "cpus": self.affinity[rank],
            "parent_pid": os.getpid(),
            "prefix": self.prefix,
            "cmd_ring": self.cmd.segment.name,
            "cmd_doorbell_r": fds[0],
            "evt_ring": self.evt_rings[rank].segment.name,
            "evt_doorbell_w": fds[1],
            "ctrl": self.control.segment.name,
            "beat_s": self.opts["watchdog"].beat_s,
            "setup": self.opts.get("worker_setup"),
            "death_fd": fds[2],
            "private_dir": self.private_dir,
            "store_path": os.path.join(self.private_dir, "store"),
            "start_timeout_s": self.opts["start_timeout_s"],
            "collective_timeout_s": self.opts["collective_timeout_s"],
            "log_level": self.opts["log_level"],
        }
        proc = start_worker(spec, fds)
        self.log_threads.append(start_log_pump(rank, proc, self.logs[rank], f"{self.prefix}log{rank}"))
        return proc

    def _check_shared_memory(self) -> None:
        """Warn (what/why/fix) when /dev/shm cannot hold this pool's rings: they then live in the
        private folder (segments.py falls back), which works but is slower."""
        need = (self.world + 1) * ring_bytes(32, 64 * 1024)
        free = free_bytes(SHM_DIR)
        if free is not None and free < need:
            log.warning(
                "%s",
                explain(
                    f"/dev/shm has {free / 2**20:.1f} MiB free; this pool's queues need {need / 2**20:.1f} MiB",
                    "the host and the workers exchange messages through /dev/shm; what does not fit goes "
                    f"through {self.private_dir} instead, which is slower",
                    SHM_SIZE_FIX,
                ),
            )

    def _wait_ready(self) -> None:
        timeout = self.opts["start_timeout_s"]
        if not self.ready.wait(timeout):
            missing = sorted(set(range(self.world)) - set(self.ready_info))
            if self.dead is not None:
                raise self.dead
            tails = "\n".join(f"  rank {r}: " + " | ".join(list(self.logs[r])[-5:]) for r in missing)
            raise RuntimeTimeout(f"timed out after {timeout:.0f} s waiting for READY from rank(s) {missing}\n{tails}")
        if self.dead is not None:
            raise self.dead

    # -- jobs -------------------------------------------------------------------------------------
    def submit(self, reference: str, args: tuple, kwargs: dict, result_rank: int | str, on_event) -> JobFuture:
        """Send job ``reference`` ("module:qualname", from jobs.job_reference) to every rank."""
        if result_rank != "all" and not (isinstance(result_rank, int) and 0 <= result_rank < self.world):
            raise ConfigError(
                f"result_rank {result_rank!r} is not a rank of this pool",
                f"the pool has ranks 0..{self.world - 1}",
                "pass an int rank or 'all'",
            )
        with self.jobs_lock:
            job_id = self.next_job_id
            self.next_job_id += 1
            fut = JobFuture(job_id, reference, self.world, result_rank, self.opts["job_timeout_s"], self)
            fut.on_event = on_event
            self.jobs[job_id] = fut
        try:
            self.cmd.put(
                ("job", job_id, reference, tuple(args), dict(kwargs), result_rank),
                timeout=self.opts["send_timeout_s"],
                what=f"job '{reference}'",
                alive=lambda: self.dead is None,
                tag=(MESSAGE_KINDS["job"], job_id),
            )
        except BaseException:
            with self.jobs_lock:
                self.jobs.pop(job_id, None)
            raise
        return fut

    def abort(self, reason: str) -> None:
        """Tear the workers down on purpose: pending jobs fail with PoolAborted(reason)."""
        if self.dead is None and not self.closed:
            self._fail(PoolAborted(f"{reason}; the workers were restarted"))

    def request_cancel(self, job_id: int) -> None:
        """Raise job ``job_id``'s cancel flag. A job no rank has started yet (queued behind another)
        ends "cancelled" at once: the workers skip it at its first safe point."""
        if self.control is None or self.closed:
            return
        self.control.request_cancel(job_id)
        fut = self.jobs.get(job_id)
        if fut is None or fut.done() or len(fut._pending_ranks) < self.world:
            return
        if all(p.job_id < job_id for p in self.control.pulses()):
            fut._finish("cancelled", JobCancelled(f"job '{fut.name}' (id {job_id}) was cancelled before it started"))

    def settling(self) -> bool:
        """A job failed on one rank while others still run it: the pool may be torn down any moment."""
        return any(f.error_deadline is not None and f._pending_ranks for f in list(self.jobs.values()))

    def wait_settled(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until no failed job has ranks still running, or the pool is dead:
        a job sent before that could land behind a job that will never finish."""
        deadline = time.monotonic() + timeout
        while self.settling() and self.dead is None and not self.closed and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- the event loop -------------------------------------------------------------------------
    def drain(self) -> bool:
        """Read every waiting message from the workers and dispatch it (any thread may call it)."""
        if not self.drain_lock.acquire(blocking=False):
            return False
        try:
            for rank, ring in enumerate(self.evt_rings):
                while True:
                    ok, msg = ring.poll()
                    if not ok:
                        break
                    if isinstance(msg, Undecodable):
                        self._undecodable(rank, msg)
                    else:
                        self._dispatch(msg)
        finally:
            self.drain_lock.release()
        return True

    @contextlib.contextmanager
    def waiting(self):
        """While a caller waits in result(), it owns the doorbells and drains the rings itself;
        the event thread then only does housekeeping (two threads waking on every message would
        fight over the GIL)."""
        with self.jobs_lock:
            self.waiters += 1
        try:
            yield
        finally:
            with self.jobs_lock:
                self.waiters -= 1

    def wait_for_messages(self, timeout: float) -> None:
        """Sleep until a worker rings its doorbell, consuming the rings' wake-up bytes."""
        import select

        try:
            ready, _, _ = select.select(self.evt_doorbells_r, [], [], timeout)
        except (OSError, ValueError):  # closed during shutdown
            time.sleep(min(timeout, 0.01))
            return
        for fd in ready:
            drain_doorbell(fd)

    def _event_loop(self) -> None:
        import select

        fds = list(self.evt_doorbells_r)
        next_check = 0.0
        while not self.stop.is_set():
            if self.waiters:
                self.stop.wait(0.02)  # a caller is draining; just keep house
                ready = []
            else:
                try:
                    ready, _, _ = select.select(fds, [], [], 0.05)
                except (OSError, ValueError):
                    return
            for fd in ready:
                drain_doorbell(fd)
            if not self.drain():
                with self.drain_lock:  # another thread is draining: let it finish, then look again
                    pass
                self.drain()
            # Housekeeping at most every 20 ms, so a result wakes its waiter without delay.
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.02
                self.cmd.collect()
                self._check_processes()
                failure = self.watch.check(list(self.jobs.values())) if self.dead is None else None
                if failure is not None and self.dead is None:
                    self._fail(failure)

    def _dispatch(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            _, rank, info = msg
            self.ready_info[rank] = info
            if len(self.ready_info) == self.world:
                self.ready.set()
        elif kind == "event":
            _, job_id, rank, ev_kind, payload = msg
            fut = self.jobs.get(job_id)
            if fut is not None and fut.on_event is not None:
                try:
                    fut.on_event(rank, ev_kind, payload)
                except Exception:
                    log.exception("event callback of job %s raised", job_id)
        elif kind == "result":
            _, job_id, rank, status, payload = msg
            fut = self.jobs.get(job_id)
            if fut is None:
                return
            fut._pending_ranks.discard(rank)
            if status == "ok":
                fut._values[rank] = payload
            elif status == "error":
                if payload["type"] == "PeerFailed" and fut._pending_ranks:
                    return  # a symptom: the failing rank's own error is on its way
                if self._peer_died(payload["message"]):
                    return  # the death itself is the error; _check_processes has failed the job
                err = WorkerError(fut.name, rank, payload["type"], payload["message"], payload["traceback"])
                if fut.error is None:
                    fut._finish("error", err)
                    fut.error_deadline = time.monotonic() + self.opts["error_grace_s"]
            elif status == "cancelled" and not fut.done():
                fut._finish("cancelled", JobCancelled(f"job '{fut.name}' (id {job_id}) was cancelled"))
            if not fut._pending_ranks:
                if not fut.done():
                    fut._finish("ok")
                with self.jobs_lock:
                    self.jobs.pop(job_id, None)

    def _undecodable(self, rank: int, msg: Undecodable) -> None:
        """A message from ``rank`` that could not be decoded (already consumed): fail its job."""
        key = (rank, msg.error.split(":", 1)[0])
        if key not in self.undecodable_logged:  # once per rank and kind of error, not per message
            self.undecodable_logged.add(key)
            log.error("could not decode a message from rank %d (job %s): %s", rank, msg.job_id, msg.error)
        fut = self.jobs.get(msg.job_id)
        if fut is None:
            return
        if msg.kind == MESSAGE_KINDS["result"]:
            fut._pending_ranks.discard(rank)
        what = "result" if msg.kind == MESSAGE_KINDS["result"] else "event"
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
            with self.jobs_lock:
                self.jobs.pop(msg.job_id, None)
        elif what == "event":
            self.control.request_cancel(msg.job_id)  # nobody waits for the rest of it

    _LINK_ERRORS = ("Connection reset", "Connection closed", "Broken pipe", "pair.cc", "NCCL", "connection")

    def _peer_died(self, message: str, wait_s: float = 1.0) -> bool:
        """A collective failing because a peer vanished is a symptom: report the death instead.
        Gives a killed process a moment to be reaped when the message looks like a lost link."""
        deadline = time.monotonic() + (wait_s if any(k in message for k in self._LINK_ERRORS) else 0.0)
        while True:
            self._check_processes()
            if self.dead is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def check_processes_now(self) -> bool:
        """Look at the processes now (not at the monitor's next tick): a worker that died while the
        pool sat idle fails the pool before a job is sent to it. True if the pool is alive."""
        self._check_processes()
        return self.dead is None and not self.closed

    def _check_processes(self) -> None:
        with self._process_check_lock:  # the monitor thread and a submitting thread
            self._check_processes_locked()

    def _check_processes_locked(self) -> None:
        if self.dead is not None:
            return
        for rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None:
                for t in self.log_threads[rank : rank + 1]:
                    t.join(timeout=1.0)  # collect the last lines it printed
                self._fail(WorkerDied(rank, code, list(self.logs[rank])))
                return

    def _fail(self, exc: BaseException) -> None:
        self.dead = exc
        self.ready.set()
        with self.jobs_lock:
            jobs = list(self.jobs.values())
            self.jobs.clear()
        for fut in jobs:
            fut._finish("error", exc)
        threading.Thread(target=self.shutdown, kwargs={"graceful": False}, daemon=True).start()

    # -- shutdown ---------------------------------------------------------------------------------
    def shutdown(self, graceful: bool = True) -> None:
        """Stop the workers and remove every segment. A second caller (e.g. start() failing while
        the monitor's teardown thread runs) waits for the first to finish instead of returning
        early: an interpreter exiting right after would kill that daemon thread mid-cleanup."""
        with self.shutdown_lock:
            first = not self.closed
            self.closed = True
        if not first:
            self.shutdown_done.wait(timeout=30.0)
            return
        try:
            self._shutdown(graceful)
        finally:
            self.shutdown_done.set()

    GRACEFUL_EXIT_S = 1.0  # an idle worker leaves in milliseconds once told to; a busy one is killed

    def _shutdown(self, graceful: bool) -> None:
        if graceful and self.dead is None and self.cmd is not None and self.procs:
            with contextlib.suppress(Exception):
                self.cmd.put(("shutdown",), timeout=0.5, what="shutdown")
            deadline = time.monotonic() + self.GRACEFUL_EXIT_S
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        kill_and_reap(self.procs)
        for fd in (self.death_r, self.death_w):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=2.0)
        for t in self.log_threads:
            t.join(timeout=2.0)
        for fd in self.cmd_doorbells_w + self.evt_doorbells_r:
            with contextlib.suppress(OSError):
                os.close(fd)
        for ring in self.evt_rings:
            ring.close(unlink=True)
        if self.cmd is not None:
            self.cmd.close(unlink=True)
        if self.control is not None:
            self.control.close(unlink=True)
        # Every creator is dead now: remove anything a killed worker could not unlink.
        sweep_segments(self.prefix)
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
        err = self.dead or PoolClosed("the pool was closed")
        with self.jobs_lock:
            jobs = list(self.jobs.values())
            self.jobs.clear()
        for fut in jobs:
            fut._finish("error", err)
