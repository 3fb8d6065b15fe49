"""Worker processes: how one is started (command line, environment, inherited pipes), how its
output reaches the host's log, and how a set of them is stopped."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding parallel_runtime/
WORKER_MODULE = f"{__package__}.worker"  # run with python -m


LOOPBACK = "lo"


def worker_env(threads: int | None) -> dict[str, str]:
    """A worker's environment: this process's, the package importable, the collectives' sockets on
    loopback, and ``OMP_NUM_THREADS`` = ``threads`` unless set (None: 1, for a launcher, whose
    workers set their own thread count)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    env["GLOO_SOCKET_IFNAME"] = LOOPBACK
    env["NCCL_SOCKET_IFNAME"] = LOOPBACK
    env.setdefault("OMP_NUM_THREADS", str(threads or 1))
    return env


def start_worker(spec_json: str, threads: int, fds: list[int], labels: Sequence[str] = ()) -> subprocess.Popen:
    """Start ``python -m parallel_runtime.runtime.worker LABELS...`` in its own session and hand it
    its spec (protocol.WorkerSpec as JSON) on its stdin: a command line is readable by every user
    of the machine, and the spec names the pool's private folders, so only ``labels`` (e.g. the
    pool's name and the rank, for people and tools) show there. The worker runs ``threads`` CPU
    threads and inherits the file descriptors ``fds`` (doorbells, death pipe); its stdout and
    stderr come back through one pipe. Every pool runs on one machine, so the collectives' own
    sockets (gloo's, NCCL's bootstrap) are bound to the loopback interface, whatever the
    environment says."""
    proc = subprocess.Popen(
        [sys.executable, "-m", WORKER_MODULE, *labels],
        env=worker_env(threads),
        pass_fds=fds,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C aimed at the host must not hit workers mid-collective
    )
    with contextlib.suppress(OSError):  # a worker that died at once is reported by the pool's monitor
        proc.stdin.write(spec_json.encode())  # a few KiB: fits the pipe, never blocks
    with contextlib.suppress(OSError):
        proc.stdin.close()
    return proc


def _pump_log(rank: int, proc: subprocess.Popen, lines: collections.deque) -> None:
    wlog = logging.getLogger(f"parallel_runtime.worker.r{rank}")
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace").rstrip()
        lines.append(line)
        wlog.debug("%s", line)
    with contextlib.suppress(Exception):
        proc.stdout.close()


def start_log_pump(rank: int, proc: subprocess.Popen, lines: collections.deque, name: str) -> threading.Thread:
    """A daemon thread that appends every line the worker prints to ``lines`` (and logs it at debug)."""
    thread = threading.Thread(target=_pump_log, args=(rank, proc, lines), name=name, daemon=True)
    thread.start()
    return thread


def kill_and_reap(procs: Sequence[subprocess.Popen], wait_s: float = 5.0) -> None:
    """SIGKILL every process still alive and reap it. Used for every forced stop: SIGTERM cannot
    interrupt a worker blocked in gloo or NCCL, and the host removes the segments a killed worker
    leaves, so asking politely first only made teardowns seconds long."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
    deadline = time.monotonic() + wait_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
