"""Job resolution and the worker-side job context.

A job is a function ``fn(ctx: JobContext, *args, **kwargs)`` run on every rank. It is named
either by a short name from ``JOB_TABLE`` or by ``"package.module:function"``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import torch

from ..errors import ConfigError, JobCancelled
from ..parallel.collectives import agree_any
from ..parallel.mesh import ParallelMesh

JOB_TABLE = MappingProxyType(
    {
        "echo": "parallel_runtime.runtime.builtin_jobs:echo",
        "noop": "parallel_runtime.runtime.builtin_jobs:noop",
        "info": "parallel_runtime.runtime.builtin_jobs:info",
        "sleep_steps": "parallel_runtime.runtime.builtin_jobs:sleep_steps",
        "fail_on_rank": "parallel_runtime.runtime.builtin_jobs:fail_on_rank",
        "all_reduce_demo": "parallel_runtime.runtime.builtin_jobs:all_reduce_demo",
        "tensor_sink": "parallel_runtime.runtime.builtin_jobs:tensor_sink",
    }
)
"""Short job names -> "module:function". Immutable; other jobs are named by their full path."""


def resolve_job(name: str) -> Callable[..., Any]:
    """Import the function a job name refers to."""
    target = JOB_TABLE.get(name, name)
    if ":" not in target:
        raise ConfigError(
            f"unknown job {name!r}",
            "a job is a short name from JOB_TABLE or a 'package.module:function' path",
            f"use one of {sorted(JOB_TABLE)} or a full 'module:function' path",
        )
    module_name, func_name = target.split(":", 1)
    module = importlib.import_module(module_name)
    try:
        return getattr(module, func_name)
    except AttributeError:
        raise ConfigError(
            f"job {name!r}: module {module_name} has no function {func_name!r}",
            "the job path must name a function defined in that module",
            "check the spelling of the job path",
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

    def emit(self, kind: str, payload: Any = None) -> None:
        """Send an event (progress, preview, log, memory...) to the host while the job runs."""
        self.emit_fn(kind, payload)

    def log(self, message: str) -> None:
        self.logger.info(message)
        self.emit("log", message)

    def cancel_requested_locally(self) -> bool:
        """This rank's view of the cancel flag (no communication; do not branch collectives on it)."""
        return self.cancel_flag_fn()

    def check_cancel(self) -> None:
        """Collective: every rank must call it at the same point. Raises JobCancelled on every rank
        if the host asked any rank to cancel."""
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
