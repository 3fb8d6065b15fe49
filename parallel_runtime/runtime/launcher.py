"""A pre-imported worker launcher, host side: one process (launcher_process.py) that imported torch
once and forks each worker, so that a pool start costs a fork instead of a fresh interpreter.

Who may use it: CPU pools only (a CUDA worker keeps the plain spawn path: forking is safe only
from a process that never initialised CUDA, which the launcher guarantees, but it is untested on
GPUs). It serves only while the package's code on disk, this host's code and the launcher's code
are one and the same and the environment equals the one it started with; otherwise it is closed
and the caller spawns (a changed package then fails with VersionSkew exactly as before).

Lifetimes: the launcher watches a death pipe of its own (the host holds the write end) and exits
the moment the host process ends; its workers are its children with ``PR_SET_PDEATHSIG``, so a
killed launcher takes its workers with it (their pools see dead workers), and each worker also
watches its pool's death pipe as before.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from .lifeline import make_death_pipe
from .protocol import CODE_HASH, PROTOCOL_VERSION, package_code_hash
from .spawn import worker_env

LAUNCHER_MODULE = f"{__package__}.launcher_process"
VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})  # changes between calls; read by nothing at import


def _import_env(threads: int | None = None) -> dict[str, str]:
    """The environment that shaped what the launcher imported (a worker gets the whole, current one)."""
    return {k: v for k, v in worker_env(threads).items() if k not in VOLATILE_ENV}


class ForkedWorker:
    """The part of ``subprocess.Popen`` a pool uses, for a worker the launcher forked: the launcher
    (its parent) reports the exit code; a worker whose launcher died has exit code -9."""

    def __init__(self, pid: int, stdout_fd: int, launcher: WorkerLauncher):
        self.pid = pid
        self.args = ["forked worker", pid]
        self.returncode: int | None = None
        self.stdout = os.fdopen(stdout_fd, "rb")
        self._launcher = launcher
        self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._launcher.exit_code(self.pid)
            if code is None and not self._launcher.alive():
                code = -signal.SIGKILL if not _running(self._pidfd) else None
            if code is not None:
                self.returncode = code
                with contextlib.suppress(OSError):
                    os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, sig)


def _running(pidfd: int) -> bool:
    import select

    return not select.select([pidfd], [], [], 0)[0]  # a pidfd turns readable when its process ends


class WorkerLauncher:
    """Start with :meth:`start`; :meth:`launch` forks a worker; :meth:`close` ends the launcher."""

    def __init__(self, preload: Sequence[str] = (), start_timeout_s: float = 180.0):
        self.preload = tuple(preload)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.env: dict[str, str] | None = None
        self._requests: socket.socket | None = None
        self._exits: socket.socket | None = None
        self._death_w: int | None = None
        self._lock = threading.Lock()
        self._codes: dict[int, int] = {}
        self._reader: threading.Thread | None = None

    def start(self) -> WorkerLauncher:
        """Start the launcher and wait until it has imported everything (seconds, once)."""
        requests, their_requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        exits, their_exits = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        death_r, self._death_w = make_death_pipe()
        self.env = _import_env()
        fds = [their_requests.fileno(), their_exits.fileno(), death_r]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", LAUNCHER_MODULE],
                env=worker_env(None),
                pass_fds=fds,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            setup = {"requests": fds[0], "exits": fds[1], "lifeline": fds[2], "preload": list(self.preload)}
            self.proc.stdin.write(json.dumps(setup).encode())
            self.proc.stdin.close()
        finally:
            for end in (their_requests, their_exits):
                end.close()
            os.close(death_r)
        self._requests, self._exits = requests, exits
        requests.settimeout(self.start_timeout_s)
        try:
            ready = json.loads(requests.recv(4096) or b"{}")
        except (OSError, ValueError):
            ready = {}
        requests.settimeout(None)
        if ready.get("ready") != [PROTOCOL_VERSION, CODE_HASH]:
            self.close()
            raise RuntimeError(f"the worker launcher did not start (it said {ready!r})")
        self._reader = threading.Thread(target=self._read_exits, name="dpar-launcher-exits", daemon=True)
        self._reader.start()
        return self

    def _read_exits(self) -> None:
        while True:
            try:
                data = self._exits.recv(4096)
            except OSError:
                data = b""
            if not data:
                return
            notice = json.loads(data)
            with self._lock:
                self._codes[notice["pid"]] = notice["code"]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._codes.pop(pid, None)

    def serves(self, device: str) -> bool:
        """True when a worker for ``device`` may be forked now: a CPU device, a live launcher, and
        the same code on disk, in this host and in the launcher, under the same environment."""
        return (
            device.startswith("cpu") and self.alive() and self.env == _import_env() and package_code_hash() == CODE_HASH
        )

    def launch(self, spec_json: str, threads: int, fds: list[int], labels: Sequence[str] = ()) -> ForkedWorker:
        """Fork a worker: like spawn.start_worker, the same fds under the same numbers."""
        out_r, out_w = os.pipe()
        env = worker_env(threads)
        request = {"spec": spec_json, "targets": list(fds), "env": env, "labels": list(labels)}
        try:
            with self._lock:
                self._requests.sendmsg(
                    [json.dumps(request).encode()],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_w, *fds]))],
                )
                self._requests.settimeout(self.start_timeout_s)
                reply = json.loads(self._requests.recv(4096) or b"{}")
                self._requests.settimeout(None)
        except BaseException:
            os.close(out_r)
            raise
        finally:
            os.close(out_w)
        if "pid" not in reply:
            os.close(out_r)
            raise RuntimeError("the worker launcher ended while forking a worker")
        return ForkedWorker(reply["pid"], out_r, self)

    def close(self) -> None:
        """End the launcher (its idle state holds no worker; live workers of open pools die with it)."""
        for sock in (self._requests, self._exits):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        if self._death_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._death_w)
            self._death_w = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
