"""WorkerPool: one worker process per device, alive between jobs, driven through shared-memory rings.

The pool validates its devices and layout before any process starts; the processes themselves
live in a :class:`~.running.RunningPool`, replaced by a fresh one after a worker dies.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ..errors import PoolClosed, PoolRestarted
from ..parallel.config import ParallelConfig, parse_devices, validate_layout
from .affinity import allowed_cpus
from .futures import EventCallback, JobFuture
from .jobs import Job, job_reference
from .launcher import WorkerLauncher
from .running import RunningPool
from .settings import RuntimeSettings

WorkerSetup = tuple[Job, tuple]  # (fn(rank, world, *args), args): run in every worker before it joins


def _default_threads(devices: list[str]) -> int:
    if devices[0].startswith("cuda"):
        return 4
    return max(1, len(allowed_cpus()) // len(devices))  # the cores this process may use, not all


class WorkerPool:
    """One worker per device, alive between jobs.

    Every limit and default is a field of :class:`~.settings.RuntimeSettings`: pass ``settings``,
    or override fields by name (``WorkerPool("cpu:2", threads_per_worker=1, start_timeout_s=60)``;
    an unknown name is a ConfigError). CPU ranks are pinned to disjoint cores when they fit
    (``pin_cpu_workers``; see :mod:`.affinity`). A rank that stops making progress becomes a
    :class:`~parallel_runtime.errors.WorkerHung` within the ``watchdog`` limits (see :mod:`.watchdog`).
    ``worker_setup`` runs a module-level function ``fn(rank, world, *args)`` in every worker before
    it joins the process group (fault injection, instrumentation).

    >>> with WorkerPool("cpu:2", ParallelConfig(ulysses=2)) as pool:
    ...     pool.submit(echo, 41).result()  # echo from parallel_runtime.runtime.builtin_jobs
    """

    def __init__(
        self,
        devices: str | Sequence[str] = "cpu:2",
        config: ParallelConfig | None = None,
        *,
        settings: RuntimeSettings | None = None,
        visible_cuda: int | None = None,
        worker_setup: WorkerSetup | None = None,
        launcher: WorkerLauncher | None = None,
        **overrides: Any,
    ):
        self.devices = parse_devices(devices)
        self.config = config or ParallelConfig(ulysses=len(self.devices))
        validate_layout(self.devices, self.config, visible_cuda)
        self.settings = (settings or RuntimeSettings()).with_overrides(**overrides)
        self.threads = self.settings.threads_per_worker or _default_threads(self.devices)
        self._setup = None if worker_setup is None else (job_reference(worker_setup[0]), tuple(worker_setup[1]))
        self._runtime: RunningPool | None = None
        self.launcher = launcher  # None: every worker is a fresh interpreter (spawn.py)
        self._lock = threading.Lock()
        self._closed = False
        self.starts = 0
        self.submitted = 0  # jobs sent since the pool was made (all restarts included)
        self._last_failure: BaseException | None = None
        self._finalizer = weakref.finalize(self, _finalize, [None])

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> WorkerPool:
        """Start the workers (if not running) and wait for READY."""
        self._ensure_started()
        return self

    def ensure_started(self) -> int:
        """Start the workers if they are not running; returns their generation (``starts``), which
        changes whenever they are replaced (state loaded into them is then gone)."""
        return self._ensure_started()[1]

    def _ensure_started(self) -> tuple[RunningPool, int]:
        with self._lock:
            if self._closed:
                raise PoolClosed("this WorkerPool was closed; create a new one")
            rt = self._runtime
            if rt is not None and rt.dead is None and not rt.closed and rt.check_processes_now():
                return rt, self.starts
            if rt is not None:
                self._last_failure = rt.dead or self._last_failure
                rt.shutdown(graceful=False)
            rt = RunningPool(self.devices, self.config, self.settings, self.threads, self._setup, self.launcher)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _finalize, [rt])
            rt.start()
            self._runtime = rt
            self.starts += 1
            return rt, self.starts

    @property
    def closed(self) -> bool:
        """True after close(): the pool cannot be used again."""
        return self._closed

    @property
    def is_alive(self) -> bool:
        rt = self._runtime
        return rt is not None and rt.dead is None and not rt.closed

    @property
    def last_failure(self) -> BaseException | None:
        """What ended the workers last (a death, a hang, an abort), even between jobs; None if never."""
        rt = self._runtime
        return rt.dead if rt is not None and rt.dead is not None else self._last_failure

    @property
    def worker_info(self) -> dict[int, dict]:
        rt = self._runtime
        return dict(rt.ready_info) if rt else {}

    @property
    def pids(self) -> list[int]:
        rt = self._runtime
        return [p.pid for p in rt.procs] if rt else []

    @property
    def shm_prefix(self) -> str | None:
        rt = self._runtime
        return rt.prefix if rt else None

    def submit(
        self,
        job: Job,
        *args: Any,
        result_rank: int | str = 0,
        on_event: EventCallback | None = None,
        generation: int | None = None,
        **kwargs: Any,
    ) -> JobFuture:
        """Run ``job(ctx, *args, **kwargs)`` on every rank; ``job`` is a module-level function (the
        workers import it by its module and name). The future holds ``result_rank``'s return
        value (or a list of every rank's with ``result_rank="all"``). With ``generation`` (from
        :meth:`ensure_started`) the job is sent only to those same workers: PoolRestarted otherwise."""
        reference = job_reference(job)  # a job the workers cannot import fails here, before anything starts
        rt, _ = self._ensure_started()
        if rt.settling():  # a failed job's other ranks may be stranded: let the pool settle first
            rt.wait_settled(self.settings.error_grace_s + 1.0)
        rt, starts = self._ensure_started()
        if generation is not None and starts != generation:
            raise PoolRestarted(
                f"the workers were restarted (generation {generation} -> {starts}) since this job was prepared; "
                "what was loaded into them is gone"
            )
        self.submitted += 1
        return rt.submit(reference, args, kwargs, result_rank, on_event)

    def run(self, job: Job, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """``submit(...).result(timeout)``."""
        return self.submit(job, *args, **kwargs).result(timeout)

    def abort(self, reason: str) -> None:
        """Tear the workers down now (e.g. a job that ignores cancel); pending jobs fail with
        PoolAborted and the next submit starts a fresh pool."""
        rt = self._runtime
        if rt is not None:
            rt.abort(reason)

    def close(self) -> None:
        """Stop every worker and remove every shared-memory segment. Idempotent."""
        with self._lock:
            self._closed = True
            rt, self._runtime = self._runtime, None
        if rt is not None:
            rt.shutdown()
        self._finalizer.detach()

    def __enter__(self) -> WorkerPool:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.is_alive else ("closed" if self._closed else "stopped")
        return f"WorkerPool({','.join(self.devices)}, {self.config.describe()}, {state})"


def _finalize(holder: list) -> None:
    """Garbage collection / interpreter exit: shut the runtime down without touching the pool."""
    rt = holder[0]
    if rt is not None:
        rt.shutdown()
