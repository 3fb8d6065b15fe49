"""The worker runtime: WorkerPool (launch, READY handshake, submit, events, cancel, monitor,
shutdown), shared-memory rings, the worker main loop (``python -m parallel_runtime.runtime.worker``),
jobs submitted by function reference, and the pool registry.
"""

from ..exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "pool": ("WorkerPool",),
        "futures": ("EventCallback", "JobFuture"),
        "pools": ("PoolRegistry",),
        "settings": ("RuntimeSettings",),
        "jobs": ("Job", "JobContext", "job_reference", "memory_info", "resolve_job"),
    },
)
