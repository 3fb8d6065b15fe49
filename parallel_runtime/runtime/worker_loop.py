"""The worker loop (started by worker.py, one process per device).

Joins torch.distributed (NCCL on CUDA, gloo on CPU) through a FileStore in the pool's private
folder (no network listener), builds the ParallelMesh, says READY, then runs jobs from the host's
broadcast ring until told to shut down or until the host process disappears.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import select
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ..errors import JobCancelled, explain
from ..parallel.mesh import ParallelMesh
from .affinity import apply_affinity
from .control import ControlBlock, ProgressRecorder
from .jobs import JobContext, memory_info, resolve_job
from .lifeline import remove_pool_files
from .protocol import (
    CODE_HASH,
    HOST_TO_WORKER,
    PROTOCOL_VERSION,
    Event,
    Ready,
    RemoteError,
    Result,
    RunJob,
    Shutdown,
    WorkerSpec,
    from_wire,
    tag_of,
    to_wire,
)
from .segments import sweep_segments
from .shm import ShmRing, Undecodable
from .watchdog import Heartbeat

# gloo's TCP loop thread wakes from epoll_wait every 10 ms even when idle (a fixed timeout in gloo),
# about 0.5% of a core per worker on a VM. A thread inherits its creator's timer slack, and the
# kernel may defer a timeout by that slack, so the loop threads, created with a 100 ms slack, wake
# about 10 times a second instead of 100. Traffic still wakes them at once (an fd event, not a timer).
GLOO_LOOP_TIMER_SLACK_S = 0.1
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


@contextlib.contextmanager
def _timer_slack_for_new_threads(seconds: float | None):
    """Give threads created inside the block a timer slack of ``seconds``; this thread gets its
    own slack back afterwards (its sleeps and timeouts stay precise). Linux only; else a no-op."""
    libc = None
    if seconds and sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            previous = libc.prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
            if previous < 0 or libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(int(seconds * 1e9)), 0, 0, 0) != 0:
                libc = None
    try:
        yield
    finally:
        if libc is not None:
            import ctypes

            libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(previous), 0, 0, 0)


class Worker:
    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.settings = spec.settings
        self.rank = spec.rank
        self.world = spec.world_size
        self.parent_pid = spec.parent_pid
        self.device = torch.device(spec.device)
        self.log = logging.getLogger(f"parallel_runtime.worker.r{self.rank}")
        self.shm_dir = spec.shm_dir
        fallback = spec.private_dir  # where our data segments go when /dev/shm is full
        self.cmd = ShmRing.attach(spec.cmd_ring, reader_index=self.rank, name_prefix="", fallback_dir=fallback)
        self.cmd.set_reader_doorbell(spec.cmd_doorbell_r)
        self.evt = ShmRing.attach(spec.evt_ring, None, os.path.join(self.shm_dir, f"r{self.rank}-"), fallback)
        self.evt.set_doorbells([spec.evt_doorbell_w])
        self.control = ControlBlock.attach(spec.control, self.world)
        self.progress = ProgressRecorder(self.control, self.rank)
        Heartbeat(self.control, self.rank, self.settings.watchdog.beat_s).start()
        self.state: dict[str, Any] = {}
        self.jobs: dict[str, Callable[..., Any]] = {}  # job reference -> imported function
        self.mesh: ParallelMesh | None = None
        self.current_job = -1

    # -- messaging ------------------------------------------------------------------------------
    def send(self, msg: Ready | Event | Result) -> None:
        self.evt.put(
            to_wire(msg),
            timeout=self.settings.event_send_timeout_s,
            what=f"{type(msg).__name__} from rank {self.rank}",
            tag=tag_of(msg),
        )

    def cancel_flag(self) -> bool:
        return self.control.is_cancelled(self.current_job)

    def run_setup_hook(self) -> None:
        """The pool's ``worker_setup`` function, if any: ``fn(rank, world, *args)`` before joining."""
        if self.spec.setup is not None:
            reference, args = self.spec.setup
            resolve_job(reference)(self.rank, self.world, *args)

    def parent_alive(self) -> bool:
        """The host process is alive: its death pipe is not at end-of-file (the host never writes
        to it). Not ``getppid()``: a worker forked by the launcher has the launcher as parent."""
        return not select.select([self.spec.death_fd], [], [], 0)[0]

    # -- lifecycle ------------------------------------------------------------------------------
    def setup(self) -> None:
        import torch.distributed as dist

        self.run_setup_hook()
        apply_affinity(list(self.spec.cpus) if self.spec.cpus is not None else None)  # before torch's threads
        torch.set_num_threads(self.spec.threads)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=self.settings.collective_timeout_s)
        store = dist.FileStore(self.spec.store_path, self.world)
        store.set_timeout(datetime.timedelta(seconds=self.settings.start_timeout_s))
        kwargs = {"device_id": self.device} if backend == "nccl" else {}
        slack = GLOO_LOOP_TIMER_SLACK_S if backend == "gloo" else None
        with _timer_slack_for_new_threads(slack):
            dist.init_process_group(
                backend, store=store, rank=self.rank, world_size=self.world, timeout=timeout, **kwargs
            )
            self.mesh = ParallelMesh.build(self.spec.config, self.device)
        # A first collective proves every link works before we say READY.
        agree = torch.ones(1, device=self.device)
        dist.all_reduce(agree)
        info = {
            "pid": os.getpid(),
            "device": str(self.device),
            "backend": backend,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "mesh": repr(self.mesh),
            **memory_info(self.device),
        }
        if self.device.type == "cuda":
            info["device_name"] = torch.cuda.get_device_name(self.device)
        self.send(self.ready_message(info))

    def ready_message(self, info: dict[str, Any]) -> Ready:
        """READY, with this worker's protocol version and code hash (the host checks them)."""
        return Ready(self.rank, PROTOCOL_VERSION, CODE_HASH, info)

    def run(self) -> None:
        while True:
            try:
                msg = self.cmd.get(timeout=self.settings.worker_idle_tick_s, what="the next job")
            except TimeoutError:
                self.evt.collect()
                if not self.parent_alive():
                    self.log.warning("host process is gone; exiting")
                    return
                continue
            if isinstance(msg, Undecodable):
                self.refuse_undecodable(msg)
                continue
            msg = from_wire(msg, "the host", HOST_TO_WORKER)  # anything else: a ProtocolError, this worker ends
            if isinstance(msg, Shutdown):
                return
            self.run_job(msg)
            # Drop our references to the job's arguments now: tensors received through shared
            # memory release their segment (so the host can recycle it) when the last view dies.
            msg = None
            self.evt.collect()

    def refuse_undecodable(self, msg: Undecodable) -> None:
        """A job this rank cannot decode fails (every rank decodes the same bytes the same way, so
        they all refuse it and none waits for another in a collective)."""
        self.log.error("could not decode job %s: %s", msg.job_id, msg.error)
        if msg.job_id >= 0:
            err = RemoteError(
                "UndecodableJob",
                explain(
                    f"the job's arguments could not be decoded on the worker ({msg.error})",
                    "workers unpickle a job's arguments by importing their classes, and this one is not "
                    "importable there",
                    "pass tensors and plain data, or objects of classes defined in importable modules",
                ),
                "",
            )
            self.send(Result(msg.job_id, self.rank, "error", error=err))

    def run_job(self, job: RunJob) -> None:
        job_id, reference = job.job_id, job.reference
        self.current_job = job_id
        self.progress.job_started(job_id)
        assert self.mesh is not None
        self.mesh.stats.reset()

        def emit(kind: str, payload: Any) -> None:
            self.send(Event(job_id, self.rank, kind, payload))

        ctx = JobContext(
            rank=self.rank,
            world_size=self.world,
            device=self.device,
            mesh=self.mesh,
            state=self.state,
            job_id=job_id,
            emit_fn=emit,
            cancel_flag_fn=self.cancel_flag,
            logger=self.log,
            progress_fn=self.progress.tick,
        )
        try:
            fn = self.jobs.get(reference) or self.jobs.setdefault(reference, resolve_job(reference))
            value = fn(ctx, *job.args, **job.kwargs)
            result = Result(job_id, self.rank, "ok", value if job.result_rank in ("all", self.rank) else None)
        except JobCancelled:
            result = Result(job_id, self.rank, "cancelled")
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the host
            error = RemoteError(type(exc).__name__, str(exc), traceback.format_exc())
            result = Result(job_id, self.rank, "error", error=error)
            self.log.error("job %s (%s) failed: %s", job_id, reference, exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.current_job = -1
            self.progress.job_ended()
        try:
            self.send(result)
        except Exception as exc:  # e.g. an unpicklable return value
            error = RemoteError(type(exc).__name__, f"could not send the result: {exc}", "")
            self.send(Result(job_id, self.rank, "error", error=error))

    def close(self) -> None:
        """Leave: drop the mappings and the data segments this rank created. The process then ends
        with os._exit (worker.py): no process-group or interpreter teardown, which took seconds and
        can wait on peers that are gone."""
        if not self.parent_alive():
            # The host (creator of the rings) died without cleaning up: nobody else will.
            remove_pool_files(self.shm_dir, self.spec.private_dir)
            return
        self.evt.close()
        self.cmd.close()
        self.control.close()
        sweep_segments(self.shm_dir, f"r{self.rank}-")  # our own data segments (we are their creator)
