"""Error types of the runtime. Every message says what is wrong, why, and how to fix it."""

from __future__ import annotations


def explain(what: str, why: str, fix: str) -> str:
    """Format a three-part error message: what is wrong, why it matters, how to fix it."""
    return f"{what}\n  why: {why}\n  fix: {fix}"


class _RebuiltFromArguments:
    """An exception whose ``__init__`` takes parts and joins them into one message pickles as the parts: a process
    pool sends exceptions back pickled, and rebuilding from the joined message would call ``__init__`` wrongly."""

    def __new__(cls, *args: object, **kwargs: object):
        made = super().__new__(cls, *args, **kwargs)  # type: ignore[call-arg]
        made._made_with = (args, kwargs)
        return made

    def __reduce__(self) -> tuple[object, ...]:
        args, kwargs = self._made_with
        return _rebuild, (type(self), args, kwargs)


def _rebuild(cls: type, args: tuple, kwargs: dict) -> BaseException:
    return cls(*args, **kwargs)


class ConfigError(_RebuiltFromArguments, ValueError):
    """A layout, device list or option that cannot work; raised before any process starts."""

    def __init__(self, what: str, why: str, fix: str):
        super().__init__(explain(what, why, fix))


class RuntimeTimeout(TimeoutError):
    """A wait that ran past its limit; the message names what was waited for."""


class WorkerError(_RebuiltFromArguments, RuntimeError):
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


class WorkerDied(_RebuiltFromArguments, RuntimeError):
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


class WorkerHung(_RebuiltFromArguments, RuntimeError):
    """A worker stopped making progress (stopped, frozen, or stalled while its peers wait for it).
    ``rank`` is None when no single rank is to blame (every rank waits on the others)."""

    def __init__(self, rank: int | None, what: str, last_lines: list[str] | None = None):
        self.rank, self.last_lines = rank, list(last_lines or [])
        tail = "\n".join(f"    {line}" for line in self.last_lines[-20:]) or "    (no output)"
        who = f"rank {rank}" if rank is not None else "the pool"
        super().__init__(
            explain(
                f"worker {what}",
                "a rank that makes no progress leaves the others waiting in a collective forever, so the pool "
                "was torn down (nothing is left running)",
                "if it was stopped on purpose (Ctrl-Z, a debugger) let it run; for a stalled GPU check "
                "nvidia-smi and dmesg; the next job starts a fresh pool automatically (the limits are "
                "WorkerPool(watchdog=WatchdogSettings(...)))",
            )
            + f"\n  last log lines of {who}:\n{tail}"
        )


class SharedMemoryFull(ConfigError):
    """A shared-memory segment did not fit /dev/shm (nor the pool's fallback folder)."""


class NonFiniteValues(_RebuiltFromArguments, RuntimeError):
    """A computation produced NaN or infinite values; the message names where (which step, which
    output), why it matters and what usually causes it."""

    def __init__(self, where: str):
        super().__init__(
            explain(
                f"{where} produced NaN or infinite values",
                "once one value is NaN it spreads to every pixel (the image would come out black)",
                "fp16 overflow is the usual cause: load the model in bf16 or fp32; also try a lower cfg, and "
                "check the model file (and any LoRA) for damage",
            )
        )


class PoolRestarted(RuntimeError):
    """The pool was restarted since the caller looked at it (its loaded state is gone)."""


class PeerFailed(RuntimeError):
    """A rank stopped a job because another rank failed it (a symptom: the host reports the other
    rank's error, not this one)."""


class ProtocolError(_RebuiltFromArguments, RuntimeError):
    """The host and a worker could not understand each other (a malformed spec or message)."""

    def __init__(self, what: str, why: str, fix: str):
        super().__init__(explain(what, why, fix))


def _describe_version(protocol: object, code: object) -> str:
    if protocol is None and code is None:
        return "a version from before protocol 2 (it names no version)"
    return f"dit-parallel code {code} (protocol {protocol})"


class VersionSkew(ProtocolError):
    """A host and a worker run different code (the package changed on disk while the host ran).
    ``host`` and ``worker`` are (protocol version, code hash); ``rank`` is None when unknown."""

    def __init__(self, rank: int | None, host: tuple[object, object], worker: tuple[object, object]):
        self.rank, self.host, self.worker = rank, tuple(host), tuple(worker)
        who = f"worker rank {rank}" if rank is not None else "a worker"
        super().__init__(
            f"the host runs {_describe_version(*host)} but {who} runs {_describe_version(*worker)}",
            "the package's files changed on disk after the host (e.g. ComfyUI) imported them (an update, a git "
            "pull, an edit) and a worker started since then loaded the new files; host and workers exchange "
            "messages and jobs that only the same code understands",
            "restart ComfyUI (or whatever program runs dit-parallel) so that it loads the package as it is now",
        )


class MonitorFailed(_RebuiltFromArguments, RuntimeError):
    """The host's monitor thread hit an unexpected error; the pool was torn down. Carries the
    traceback (``remote`` is not involved: this happened on the host)."""

    def __init__(self, what: str, traceback: str):
        self.traceback = traceback
        super().__init__(
            explain(
                f"the pool's monitor thread failed {what}",
                "the thread that reads the workers' messages and watches them cannot go on, so the pool was torn "
                "down and every pending job failed with this error",
                "the next job starts a fresh pool; if this repeats, restart the program and report the traceback below",
            )
            + f"\n--- host traceback ---\n{traceback.rstrip()}"
        )
