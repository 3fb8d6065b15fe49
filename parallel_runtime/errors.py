"""Error types of the runtime. Every message says what is wrong, why, and how to fix it."""

from __future__ import annotations


def explain(what: str, why: str, fix: str) -> str:
    """Format a three-part error message: what is wrong, why it matters, how to fix it."""
    return f"{what}\n  why: {why}\n  fix: {fix}"


class ConfigError(ValueError):
    """A layout, device list or option that cannot work; raised before any process starts."""

    def __init__(self, what: str, why: str, fix: str):
        super().__init__(explain(what, why, fix))


class RuntimeTimeout(TimeoutError):
    """A wait that ran past its limit; the message names what was waited for."""


class WorkerError(RuntimeError):
    """A job raised on a worker. Carries the rank, exception type and remote traceback."""

    def __init__(self, job: str, rank: int, exc_type: str, message: str, traceback: str):
        self.job, self.rank, self.exc_type, self.remote_message, self.remote_traceback = (
            job,
            rank,
            exc_type,
            message,
            traceback,
        )
        super().__init__(
            f"job '{job}' failed on rank {rank}: {exc_type}: {message}\n"
            f"--- remote traceback (rank {rank}) ---\n{traceback.rstrip()}"
        )


class WorkerDied(RuntimeError):
    """A worker process exited while the pool was running."""

    def __init__(self, rank: int, exitcode: int | None, last_lines: list[str], context: str = ""):
        self.rank, self.exitcode, self.last_lines = rank, exitcode, last_lines
        tail = "\n".join(f"    {line}" for line in last_lines[-20:]) or "    (no output)"
        hint = ""
        if exitcode is not None and exitcode < 0:
            import signal

            try:
                hint = f" (killed by {signal.Signals(-exitcode).name})"
            except ValueError:
                hint = f" (signal {-exitcode})"
        super().__init__(
            explain(
                f"worker rank {rank} died with exit code {exitcode}{hint}{context}",
                "a worker process ended while the pool was running (killed, crashed, or out of memory); "
                "the other workers were shut down because their collectives can no longer complete",
                "check the last log lines below; the next job starts a fresh pool automatically",
            )
            + f"\n  last log lines of rank {rank}:\n{tail}"
        )


class JobCancelled(RuntimeError):
    """A job ended because cancel was requested; the pool stays warm."""


class PoolClosed(RuntimeError):
    """The pool was closed; submit on a new pool."""


class PoolAborted(RuntimeError):
    """The workers were torn down on purpose (a job ignored cancel or ran past its limit); the
    next job starts a fresh pool."""
