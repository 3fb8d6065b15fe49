"""The host <-> worker protocol: the worker's spec, every message, and the version check.

* :class:`WorkerSpec`: what a worker is started with (JSON on its stdin), read back
  strictly: a missing or unknown key is a :class:`ProtocolError`, never a ``KeyError``.
* Messages, one named tuple per kind: host -> worker :class:`RunJob`, :class:`Shutdown`; worker ->
  host :class:`Ready`, :class:`Event`, :class:`Result`. Each has a ``TAG``: it leads the message on
  the wire (:func:`to_wire`, :func:`from_wire`, which refuses anything malformed) and marks its ring
  slot (shm.py), so a message that cannot be decoded is still reported for its job.
* Versions: :data:`PROTOCOL_VERSION` changes with any change to the spec or a message, and
  :data:`CODE_HASH` (a hash of the package's ``.py`` files, taken when this module is imported)
  with any change at all. The spec carries the host's; a worker of other code refuses it at once
  (:func:`refuse`: one line the host parses, a dedicated exit code), and ``Ready`` carries the
  worker's, which the host checks again. Either way both sides fail with a :class:`VersionSkew`
  naming both versions.

Imports only the standard library and light modules: a worker reads its spec before torch loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ProtocolError, VersionSkew
from ..parallel.config import ParallelConfig
from .settings import RuntimeSettings
from .watchdog import WatchdogSettings

PROTOCOL_VERSION = 3
"""Version 1 was the untyped protocol (a dict spec, tuple messages), which named no version; version 2
had the spec on the worker's command line and every segment directly in /dev/shm."""

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # parallel_runtime/
EXIT_REFUSED = 78  # a worker that refused its spec exits with this (EX_CONFIG)
REFUSAL_PREFIX = "dit-parallel worker refused its spec: "  # + JSON; never changes, whatever the version


def package_code_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """A short hash of every ``.py`` file under ``package_dir`` (paths and bytes): about 5 ms."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(package_dir.rglob("*.py")):
        data = path.read_bytes()
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


CODE_HASH = package_code_hash()
"""This process's code: hashed when the runtime is imported (later edits on disk do not change what
already runs, and must not change this either)."""


# -- messages ----------------------------------------------------------------------------------------
# Named tuples: typed where they are made and read, and on the wire a plain tuple (TAG, *fields),
# which pickles and unpickles in C (a frozen dataclass cost about 3x as much per message).


class RunJob(NamedTuple):
    """Host -> every worker: run ``reference`` ("module:qualname") with these arguments."""

    job_id: int
    reference: str
    args: tuple
    kwargs: dict[str, Any]
    result_rank: int | str  # a rank, or "all"
    TAG = 1


class Shutdown(NamedTuple):
    """Host -> every worker: leave now."""

    TAG = 2


class Ready(NamedTuple):
    """Worker -> host, once: joined the process group and passed a first collective. ``rank``,
    ``protocol`` and ``code`` lead it in every version (the host reads them from any worker)."""

    rank: int
    protocol: int
    code: str
    info: dict[str, Any]  # pid, device, backend, threads, cpus, mesh, memory...
    TAG = 3


class Event(NamedTuple):
    """Worker -> host while a job runs (progress, previews, logs, memory)."""

    job_id: int
    rank: int
    kind: str
    payload: Any
    TAG = 4


class RemoteError(NamedTuple):
    """A job's failure on a worker, as the host reports it."""

    type: str
    message: str
    traceback: str


class Result(NamedTuple):
    """Worker -> host: how ``job_id`` ended on ``rank``."""

    job_id: int
    rank: int
    status: str  # "ok" | "error" | "cancelled"
    value: Any = None  # "ok" on the job's result rank(s)
    error: RemoteError | None = None  # "error"
    TAG = 5


Message = RunJob | Shutdown | Ready | Event | Result
HOST_TO_WORKER = (RunJob, Shutdown)
WORKER_TO_HOST = (Ready, Event, Result)
_BY_TAG: dict[int, Any] = {cls.TAG: cls for cls in (*HOST_TO_WORKER, *WORKER_TO_HOST)}


def tag_of(message: Message) -> tuple[int, int]:
    """(kind, job id) for the ring slot's header (job id -1 for messages of no job)."""
    return message.TAG, getattr(message, "job_id", -1)


def to_wire(message: Message) -> tuple:
    return (message.TAG, *message)


def from_wire(obj: Any, sender: str, expected: tuple[type, ...]) -> Message:
    """The message ``obj`` (a wire tuple from ``sender``) stands for; a ProtocolError if it is none
    of ``expected``. A READY of another version becomes a Ready naming that version (the host then
    reports the skew, whatever else that READY holds)."""
    cls = _BY_TAG.get(obj[0]) if type(obj) is tuple and obj and type(obj[0]) is int else None
    if cls is Ready and cls in expected and len(obj) >= 4 and (obj[2], obj[3]) != (PROTOCOL_VERSION, CODE_HASH):
        return Ready(obj[1], obj[2], obj[3], {})
    if cls in expected and len(obj) == len(cls._fields) + 1:
        return tuple.__new__(cls, obj[1:])
    shape = f"a {type(obj).__name__}" + (
        f" tagged {obj[0]!r} of {len(obj)} items" if type(obj) is tuple and obj else ""
    )
    raise ProtocolError(
        f"{sender} sent {shape}, which is no message of protocol {PROTOCOL_VERSION}",
        f"it may send only {', '.join(c.__name__ for c in expected)}; anything else comes from other code (or a bug)",
        "restart the program that runs dit-parallel",
    )


# -- the worker's spec ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker is started with (one per rank)."""

    protocol: int  # the host's PROTOCOL_VERSION
    code: str  # the host's CODE_HASH
    rank: int
    world_size: int
    device: str
    config: ParallelConfig
    threads: int
    cpus: tuple[int, ...] | None  # the cores to pin this rank to; None: not pinned
    parent_pid: int
    shm_dir: str  # 0700, under /dev/shm: every shared-memory segment of the pool (segments.py)
    private_dir: str  # 0700: the rendezvous store, segments that do not fit /dev/shm
    store_path: str
    cmd_ring: str
    cmd_doorbell_r: int
    evt_ring: str
    evt_doorbell_w: int
    control: str  # the control block's segment (cancel flags, pulse rows)
    death_fd: int  # lifeline.py
    setup: tuple[str, tuple] | None  # worker_setup: (job reference, args)
    settings: RuntimeSettings

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        """The spec a host sent. Another host version: :class:`VersionSkew`; a malformed spec:
        :class:`ProtocolError` (what was missing or unknown)."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise _malformed(f"the worker's spec is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise _malformed(f"the worker's spec is a {type(data).__name__}, not a mapping")
        host = (data.get("protocol"), data.get("code"))
        if host != (PROTOCOL_VERSION, CODE_HASH):
            rank = data.get("rank")
            raise VersionSkew(rank if isinstance(rank, int) else None, host, (PROTOCOL_VERSION, CODE_HASH))
        spec = _build(cls, data, "spec")
        setup = None if spec.setup is None else (str(spec.setup[0]), tuple(spec.setup[1]))
        cpus = None if spec.cpus is None else tuple(spec.cpus)
        return dataclasses.replace(spec, setup=setup, cpus=cpus)


_NESTED = {"config": ParallelConfig, "settings": RuntimeSettings, "watchdog": WatchdogSettings}


def _build(cls: type, data: Any, where: str) -> Any:
    """``cls(**data)`` with nested dataclasses, refusing missing and unknown keys."""
    if not isinstance(data, dict):
        raise _malformed(f"{where} is a {type(data).__name__}, not a mapping")
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in data]
    unknown = sorted(set(data) - set(names))
    if missing or unknown:
        parts = [f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else ""]
        raise _malformed(f"the worker's {where} has {' and '.join(p for p in parts if p)}")
    values = {k: _build(_NESTED[k], v, f"{where}.{k}") if k in _NESTED else v for k, v in data.items()}
    try:
        return cls(**values)
    except Exception as exc:  # noqa: BLE001 - a value the class refuses (e.g. a degree of 0)
        raise _malformed(f"the worker's {where} holds a value {cls.__name__} refuses: {exc}") from None


def _malformed(what: str) -> ProtocolError:
    return ProtocolError(
        what,
        "the host and its workers must agree on every field of the spec; a mismatch means different code on "
        "the two sides or a bug",
        "restart the program that runs dit-parallel; if it persists, report it with this message",
    )


# -- a worker refusing its spec ----------------------------------------------------------------------


def refuse(error: ProtocolError) -> None:
    """Worker side: print why (for people) and one line the host parses, then exit EXIT_REFUSED at
    once (nothing else was started)."""
    record = {"protocol": PROTOCOL_VERSION, "code": CODE_HASH, "problem": str(error)}
    sys.stderr.write(f"{error}\n")
    sys.stderr.flush()
    sys.stdout.write(REFUSAL_PREFIX + json.dumps(record) + "\n")
    sys.stdout.flush()
    os._exit(EXIT_REFUSED)


def refusal_error(rank: int, lines: list[str]) -> ProtocolError | None:
    """Host side: the error for a worker that exited EXIT_REFUSED, from its printed ``lines``
    (None if it printed no refusal: then it is just a dead worker)."""
    for line in reversed(lines):
        if line.startswith(REFUSAL_PREFIX):
            try:
                record = json.loads(line[len(REFUSAL_PREFIX) :])
                worker = (record.get("protocol"), record.get("code"))
                problem = str(record.get("problem", ""))
            except (ValueError, AttributeError):
                return None
            if worker != (PROTOCOL_VERSION, CODE_HASH):
                return VersionSkew(rank, (PROTOCOL_VERSION, CODE_HASH), worker)
            return ProtocolError(
                f"worker rank {rank} refused its spec: {problem.splitlines()[0] if problem else '(no reason)'}",
                "the host and the worker run the same code, so the spec the host wrote does not match its own "
                "reader: a bug",
                "report it with this message",
            )
    return None


def ready_error(message: Any) -> VersionSkew | None:
    """Host side: a VersionSkew if a READY comes from other code than the host's."""
    worker = (getattr(message, "protocol", None), getattr(message, "code", None))
    if worker == (PROTOCOL_VERSION, CODE_HASH):
        return None
    rank = getattr(message, "rank", None)
    return VersionSkew(rank if isinstance(rank, int) else None, (PROTOCOL_VERSION, CODE_HASH), worker)
