"""RunningPool: the processes, shared-memory rings and monitor thread of one started WorkerPool.

Lifecycle: launch -> READY handshake -> jobs -> shutdown. The monitor thread (the event loop)
drains the workers' rings, settles job futures (job_table.py) and watches the processes: a dead
worker, a hung one (pool_watch.py), a worker of other code (protocol.py: VersionSkew) or a job
failure that strands the other ranks fails every pending job with an error naming the rank and
tears the pool down; the WorkerPool then starts a fresh RunningPool on the next submit. A message
that cannot be decoded fails its job only. The monitor never dies silently: anything it raises
fails the pool and every pending job with a MonitorFailed carrying the traceback.
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
import traceback
import uuid

from ..errors import (
    ConfigError,
    JobCancelled,
    MonitorFailed,
    PoolAborted,
    PoolClosed,
    RuntimeTimeout,
    WorkerDied,
    explain,
)
from ..parallel.config import ParallelConfig
from .affinity import allowed_cpus, plan_cpu_affinity
from .control import ControlBlock
from .futures import JobFuture
from .job_table import JobTable
from .launcher import WorkerLauncher
from .lifeline import make_death_pipe
from .pool_watch import PoolWatch
from .protocol import (
    CODE_HASH,
    EXIT_REFUSED,
    PROTOCOL_VERSION,
    WORKER_TO_HOST,
    Event,
    Ready,
    Result,
    RunJob,
    Shutdown,
    WorkerSpec,
    from_wire,
    ready_error,
    refusal_error,
    tag_of,
    to_wire,
)
from .segments import SHM_DIR, SHM_SIZE_FIX, free_bytes, make_segment_dir, remove_segment_dir
from .settings import RuntimeSettings
from .shm import ShmRing, Undecodable, drain_doorbell, make_doorbell, ring_bytes
from .spawn import kill_and_reap, start_log_pump, start_worker
from .stale_pools import sweep_dead_hosts

log = logging.getLogger(__name__)

EVENT_WAIT_S = 0.05  # the monitor's sleep on the doorbells when nobody else drains
HOUSEKEEPING_S = 0.02  # the monitor's process checks and watchdog at most this often


class RunningPool:
    """The processes, rings and monitor thread of one running pool (replaced after a death).

    ``threads``: CPU threads per worker (resolved); ``worker_setup``: (job reference, args) or None."""

    def __init__(
        self,
        devices: list[str],
        config: ParallelConfig,
        settings: RuntimeSettings,
        threads: int,
        worker_setup: tuple[str, tuple] | None = None,
        launcher: WorkerLauncher | None = None,
    ):
        self.devices, self.config, self.settings = devices, config, settings
        self.launcher = launcher  # forks pre-imported workers where it serves (launcher.py)
        self.threads, self.worker_setup = threads, worker_setup
        self.world = len(devices)
        self.prefix = f"dpar-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
        self.procs: list[subprocess.Popen] = []
        self.logs = [collections.deque(maxlen=200) for _ in devices]
        self.table = JobTable(settings.error_grace_s, self._peer_died, self._cancel_on_workers)
        self.waiters_lock = threading.Lock()
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
        self.private_dir: str | None = None  # 0700: the rendezvous store, segments that do not fit /dev/shm
        self.shm_dir: str | None = None  # 0700, under /dev/shm: every segment of this pool (segments.py)
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
            self.shm_dir = make_segment_dir(self.prefix, self.private_dir)
            self.death_r, self.death_w = make_death_pipe()
            self._check_shared_memory()
            self.control = ControlBlock.create(self._segment("ctrl"), self.world)
            self.cmd = ShmRing.create(self._segment("cmd"), n_readers=self.world, fallback_dir=self.private_dir)
            child_fds: list[list[int]] = []
            for rank in range(self.world):
                evt = ShmRing.create(self._segment(f"evt{rank}"), n_readers=1, fallback_dir=self.private_dir)
                evt.reader_index = 0
                self.evt_rings.append(evt)
                cmd_r, cmd_w = make_doorbell()
                evt_r, evt_w = make_doorbell()
                self.cmd_doorbells_w.append(cmd_w)
                self.evt_doorbells_r.append(evt_r)
                child_fds.append([cmd_r, evt_w, self.death_r])
            self.cmd.set_doorbells(self.cmd_doorbells_w)
            if self.settings.pin_cpu_workers:
                self.affinity = plan_cpu_affinity(self.devices, self.threads, allowed_cpus())
            for rank, device in enumerate(self.devices):
                self.procs.append(self._launch(rank, device, child_fds[rank]))
                for fd in child_fds[rank][:2]:
                    os.close(fd)
            os.close(self.death_r)  # only the workers hold the read end
            self.death_r = None
            self.watch = PoolWatch(self.settings.watchdog, self.control, self.procs, self.logs)
            self.thread = threading.Thread(target=self._monitor, name=f"{self.prefix}events", daemon=True)
            self.thread.start()
            self._wait_ready()
        except BaseException:
            self.shutdown(graceful=False)
            raise
        log.info("pool %s started %d worker(s) in %.2f s", self.prefix, self.world, time.monotonic() - t0)

    def _segment(self, name: str) -> str:
        return os.path.join(self.shm_dir, name)

    def _launch(self, rank: int, device: str, fds: list[int]) -> subprocess.Popen:
        cpus = self.affinity[rank]
        spec = WorkerSpec(
            protocol=PROTOCOL_VERSION,
            code=CODE_HASH,
            rank=rank,
            world_size=self.world,
            device=device,
            config=self.config,
            threads=self.threads,
            cpus=None if cpus is None else tuple(cpus),
            parent_pid=os.getpid(),
            shm_dir=self.shm_dir,
            private_dir=self.private_dir,
            store_path=os.path.join(self.private_dir, "store"),
            cmd_ring=self.cmd.segment.name,
            cmd_doorbell_r=fds[0],
            evt_ring=self.evt_rings[rank].segment.name,
            evt_doorbell_w=fds[1],
            control=self.control.segment.name,
            death_fd=fds[2],
            setup=self.worker_setup,
            settings=self.settings,
        )
        labels = (f"--pool={self.prefix}", f"--rank={rank}")
        if self.launcher is not None and self.launcher.serves(device):
            proc = self.launcher.launch(spec.to_json(), self.threads, fds, labels)
        else:
            proc = start_worker(spec.to_json(), self.threads, fds, labels)
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
        timeout = self.settings.start_timeout_s
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

        def make(job_id: int) -> JobFuture:
            fut = JobFuture(job_id, reference, self.world, result_rank, self.settings.job_timeout_s, self)
            fut.on_event = on_event
            return fut

        fut = self.table.add(make)
        job = RunJob(fut.job_id, reference, tuple(args), dict(kwargs), result_rank)
        try:
            self.cmd.put(
                to_wire(job),
                timeout=self.settings.send_timeout_s,
                what=f"job '{reference}'",
                alive=lambda: self.dead is None,
                tag=tag_of(job),
            )
        except BaseException:
            self.table.remove(fut.job_id)
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
        fut = self.table.get(job_id)
        if fut is None or fut.done() or len(fut._pending_ranks) < self.world:
            return
        if all(p.job_id < job_id for p in self.control.pulses()):
            fut._finish("cancelled", JobCancelled(f"job '{fut.name}' (id {job_id}) was cancelled before it started"))

    def _cancel_on_workers(self, job_id: int) -> None:
        if self.control is not None:
            self.control.request_cancel(job_id)

    def settling(self) -> bool:
        """A job failed on one rank while others still run it: the pool may be torn down any moment."""
        return self.table.settling()

    def wait_settled(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until no failed job has ranks still running, or the pool is dead:
        a job sent before that could land behind a job that will never finish."""
        deadline = time.monotonic() + timeout
        while self.settling() and self.dead is None and not self.closed and time.monotonic() < deadline:
            time.sleep(0.01)

    # -- the event loop -------------------------------------------------------------------------
    def drain(self) -> bool:
        """Read every waiting message from the workers and handle it (any thread may call it). A
        message whose handling raises fails the pool (MonitorFailed, with the traceback)."""
        if not self.drain_lock.acquire(blocking=False):
            return False
        try:
            for rank, ring in enumerate(self.evt_rings):
                while self.dead is None:
                    ok, msg = ring.poll()
                    if not ok:
                        break
                    try:
                        self._handle(rank, msg)
                    except Exception:  # noqa: BLE001 - must end the pool, not the thread
                        self._monitor_failed(f"on a message from rank {rank}", traceback.format_exc())
        finally:
            self.drain_lock.release()
        return True

    def _handle(self, rank: int, raw: object) -> None:
        if isinstance(raw, Undecodable):
            self.table.undecodable(rank, raw)
            return
        msg = from_wire(raw, f"rank {rank}", WORKER_TO_HOST)
        if isinstance(msg, Result):
            self.table.result(msg)
        elif isinstance(msg, Event):
            self.table.event(msg)
        else:
            self._on_ready(msg)

    def _on_ready(self, msg: Ready) -> None:
        skew = ready_error(msg)
        if skew is not None:
            log.error("%s", skew)
            self._fail(skew)
            return
        self.ready_info[msg.rank] = msg.info
        if len(self.ready_info) == self.world:
            self.ready.set()

    @contextlib.contextmanager
    def waiting(self):
        """While a caller waits in result(), it owns the doorbells and drains the rings itself;
        the event thread then only does housekeeping (two threads waking on every message would
        fight over the GIL)."""
        with self.waiters_lock:
            self.waiters += 1
        try:
            yield
        finally:
            with self.waiters_lock:
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

    def _monitor(self) -> None:
        """The monitor thread: anything it raises fails the pool, never just ends the thread."""
        try:
            self._event_loop()
        except Exception:  # noqa: BLE001 - see the docstring
            if not self.stop.is_set():
                self._monitor_failed("while watching the workers", traceback.format_exc())

    def _monitor_failed(self, what: str, trace: str) -> None:
        """Fail the pool and every pending job with the traceback (logged once: the pool is dead after)."""
        if self.dead is None and not self.closed:
            error = MonitorFailed(what, trace)
            log.error("%s", error)
            self._fail(error)

    def _event_loop(self) -> None:
        import select

        fds = list(self.evt_doorbells_r)
        next_check = 0.0
        while not self.stop.is_set():
            if self.waiters:
                self.stop.wait(HOUSEKEEPING_S)  # a caller is draining; just keep house
                ready = []
            else:
                try:
                    ready, _, _ = select.select(fds, [], [], EVENT_WAIT_S)
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
                next_check = now + HOUSEKEEPING_S
                self.cmd.collect()
                self._check_processes()
                failure = self.watch.check(self.table.pending()) if self.dead is None else None
                if failure is not None and self.dead is None:
                    self._fail(failure)

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
                lines = list(self.logs[rank])
                refused = refusal_error(rank, lines) if code == EXIT_REFUSED else None
                if refused is not None:
                    log.error("%s", refused)
                self._fail(refused or WorkerDied(rank, code, lines))
                return

    def _fail(self, exc: BaseException) -> None:
        self.dead = exc
        self.ready.set()
        self.table.fail_all(exc)
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

    def _shutdown(self, graceful: bool) -> None:
        if graceful and self.dead is None and self.cmd is not None and self.procs:
            with contextlib.suppress(Exception):
                self.cmd.put(to_wire(Shutdown()), timeout=0.5, what="shutdown", tag=tag_of(Shutdown()))
            deadline = time.monotonic() + self.settings.graceful_exit_s
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        kill_and_reap(self.procs)
        # Every creator is dead now: remove what a killed worker could not unlink, at once (the
        # mappings stay valid; unlinking below tolerates missing names). Done before the joins below,
        # which can take seconds: a host killed meanwhile would leave these until the next pool's
        # sweep (stale_pools.py). The folders are this pool's own (0700, made exclusively): whatever
        # another user put under a similar name elsewhere is neither looked at nor touched.
        remove_segment_dir(self.shm_dir)
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
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
        self.table.fail_all(self.dead or PoolClosed("the pool was closed"))
