"""Job references and the worker-side job context.

A job is a module-level function ``fn(ctx: JobContext, *args, **kwargs)`` run on every rank. The
host submits the function object; :func:`job_reference` turns it into "module:qualified name",
which the worker imports with :func:`resolve_job` (a job is never named by a hand-written string).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError, JobCancelled
from ..parallel.collectives import agree_any
from ..parallel.mesh import ParallelMesh

Job = Callable[..., Any]  # fn(ctx: JobContext, *args, **kwargs)

_IMPORTABLE_FIX = "define the job as a module-level function in an importable module and submit that function"


def _lookup(module: Any, qualname: str) -> Any:
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def job_reference(job: Job) -> str:
    """The "module:qualname" a worker imports ``job`` by (checked here, before anything is sent)."""
    module = getattr(job, "__module__", None)
    qualname = getattr(job, "__qualname__", None)
    if not callable(job) or not isinstance(module, str) or not isinstance(qualname, str):
        raise ConfigError(
            f"job {job!r} is not a function",
            "a job is a module-level function fn(ctx, *args, **kwargs) that every worker imports by its name",
            "pass the function object itself, e.g. pool.submit(echo, 1)",
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        kind = "a lambda" if "<lambda>" in qualname else "defined inside another function"
        raise ConfigError(
            f"job {module}.{qualname} is {kind}",
            "workers are separate processes that import a job by its module and name; "
            "lambdas and nested functions have no name they can import",
            _IMPORTABLE_FIX,
        )
    if module == "__main__":
        raise ConfigError(
            f"job {qualname} is defined in the __main__ script",
            "workers import a job's module by name, and __main__ in a worker is the worker itself",
            "move the job into a module of its own and import it from the script",
        )
    try:
        found = _lookup(sys.modules[module], qualname)
    except (KeyError, AttributeError):
        found = None
    if found is not job:
        raise ConfigError(
            f"job {module}.{qualname} cannot be found under that name",
            "workers import a job by its module and qualified name, which here do not lead back to the "
            "function (a bound method, a decorated or a renamed function?)",
            _IMPORTABLE_FIX,
        )
    return f"{module}:{qualname}"


def resolve_job(reference: str) -> Job:
    """The function a :func:`job_reference` names (imported on the worker)."""
    module_name, _, qualname = reference.partition(":")
    try:
        return _lookup(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"job {reference} cannot be imported on the worker ({exc})",
            "workers import jobs from the modules the host's functions live in, with the host's package root "
            "on their path",
            "keep job modules importable from the folder holding parallel_runtime (or on PYTHONPATH)",
        ) from None


@dataclasses.dataclass
class JobContext:
    """What a job sees on its rank: the mesh, the device, persistent state, events, cancel."""

    rank: int
    world_size: int
    device: torch.device
    mesh: ParallelMesh
    state: dict[str, Any]  # survives between jobs of this worker (e.g. a loaded model)
    job_id: int
    emit_fn: Callable[[str, Any], None]
    cancel_flag_fn: Callable[[], bool]
    logger: logging.Logger
    progress_fn: Callable[[], None] = lambda: None  # a progress point for the host's watchdog

    def emit(self, kind: str, payload: Any = None) -> None:
        """Send an event (progress, preview, log, memory...) to the host while the job runs."""
        self.progress_fn()
        self.emit_fn(kind, payload)

    def progress(self) -> None:
        """Tell the host's watchdog this rank is moving (a step, a patch, a loaded component): the
        bound on a silent rank scales with the time between these."""
        self.progress_fn()

    def cancel_requested(self) -> bool:
        """This rank's own view of the cancel flag, with no communication. Only for stopping work
        that involves no collective (e.g. loading weights); agree with :meth:`check_cancel` after."""
        return self.cancel_flag_fn()

    def log(self, message: str) -> None:
        self.logger.info(message)
        self.emit("log", message)

    def check_cancel(self) -> None:
        """Collective: every rank must call it at the same point. Raises JobCancelled on every rank
        if the host asked any rank to cancel."""
        self.progress_fn()  # this rank has arrived at the safe point
        if agree_any(self.cancel_flag_fn()):
            raise JobCancelled(f"job {self.job_id} cancelled")

    def report_memory(self) -> dict[str, int]:
        """Emit and return this rank's memory use (device allocated/peak, process RSS)."""
        info = memory_info(self.device)
        self.emit("memory", info)
        return info


def memory_info(device: torch.device) -> dict[str, int]:
    info: dict[str, int] = {"rss_bytes": _rss_bytes()}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        info.update(
            allocated_bytes=torch.cuda.memory_allocated(device),
            reserved_bytes=torch.cuda.memory_reserved(device),  # held by torch's cache: free for this process
            peak_bytes=torch.cuda.max_memory_allocated(device),
            free_bytes=free,
            total_bytes=total,
        )
    return info


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            import os

            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0
