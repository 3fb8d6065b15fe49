"""Worker processes: how one is started (command line, environment, inherited doorbells), how its
output reaches the host's log, and how a set of them is stopped."""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding parallel_runtime/
WORKER_MODULE = f"{__package__}.worker"  # run with python -m


def start_worker(spec: dict[str, Any], fds: list[int]) -> subprocess.Popen:
    """Start ``python -m parallel_runtime.runtime.worker '<spec>'`` in its own session, passing it
    the doorbell file descriptors ``fds``; its stdout and stderr come back through one pipe."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    if spec["device"] == "cpu":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    return subprocess.Popen(
        [sys.executable, "-m", WORKER_MODULE, json.dumps(spec)],
        env=env,
        pass_fds=fds,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C aimed at the host must not hit workers mid-collective
    )


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


def terminate(procs: Sequence[subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``grace`` seconds."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=5.0)
