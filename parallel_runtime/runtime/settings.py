"""RuntimeSettings: every default, limit and timeout of a worker pool, in one place.

The host builds one per pool (``WorkerPool(settings=..., **overrides)``) and hands it to each
worker inside its spec (protocol.py), so both sides use the same numbers and neither has a default
of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ConfigError
from .watchdog import WatchdogSettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    """Limits of one pool (seconds unless named otherwise)."""

    threads_per_worker: int | None = None  # CPU threads per worker; None: automatic (pool.py)
    pin_cpu_workers: bool = True  # CPU ranks on disjoint cores when they fit (affinity.py)
    log_level: str = "INFO"  # the workers' log level
    start_timeout_s: float = 180.0  # launch to READY from every rank (rendezvous included)
    job_timeout_s: float = 3600.0  # JobFuture.result() without a timeout
    send_timeout_s: float = 120.0  # the host waiting for a free slot in the command ring
    event_send_timeout_s: float = 600.0  # a worker waiting for a free slot in its event ring
    collective_timeout_s: float = 1800.0  # torch.distributed's limit on one collective
    error_grace_s: float = 5.0  # a job failed on one rank: how long the others may take to finish
    graceful_exit_s: float = 1.0  # an idle worker leaves in milliseconds once told to; a busy one is killed
    worker_idle_tick_s: float = 1.0  # how often an idle worker looks whether its host is still there
    watchdog: WatchdogSettings = WatchdogSettings()  # hung-rank limits (watchdog.py)

    def __post_init__(self) -> None:
        if self.threads_per_worker is not None and (
            not isinstance(self.threads_per_worker, int) or self.threads_per_worker < 1
        ):
            raise ConfigError(
                f"threads_per_worker={self.threads_per_worker}",
                "each worker needs at least one CPU thread",
                "leave it unset (automatic) or give a positive number",
            )
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log_level={self.log_level!r}",
                "the workers log through Python's logging, which knows only its named levels",
                f"use one of {', '.join(LOG_LEVELS)}",
            )
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_s") and not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(
                    f"{field.name}={value!r}",
                    "every limit is a number of seconds, and a limit of zero or less would fail every wait at once",
                    f"give {field.name} a positive number of seconds (default {getattr(RuntimeSettings, field.name)})",
                )

    def with_overrides(self, **overrides: Any) -> RuntimeSettings:
        """These settings with some fields replaced; an unknown name is a ConfigError."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(
                f"unknown pool option(s) {', '.join(unknown)}",
                "a pool's options are the fields of RuntimeSettings",
                f"use some of: {', '.join(sorted(names))}",
            )
        if overrides.get("watchdog", self.watchdog) is None:
            overrides["watchdog"] = WatchdogSettings()
        return dataclasses.replace(self, **overrides) if overrides else self

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready; the watchdog's settings as a nested dict)."""
        return dataclasses.asdict(self)
