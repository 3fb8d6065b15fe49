"""The launcher process: ``python -m parallel_runtime.runtime.launcher_process``, started by a host
(launcher.py) to import torch and the worker's modules once and fork a worker per request, so that
a pool start costs a fork instead of a fresh interpreter importing torch.

Its stdin holds ``{"requests": fd, "exits": fd, "lifeline": fd}`` (socket ends and the read end of
its own death pipe, all inherited through ``pass_fds``). It arms the lifeline before importing
anything slow: when the host process ends, the launcher removes the folders of every pool it forked
workers for and exits (its workers end through their pools' own death pipes and, as its children,
through ``PR_SET_PDEATHSIG``, which may kill a worker before its own cleanup ran: hence the
launcher's). It never
initialises CUDA and never runs a torch operation: a fork after either would give children a
broken CUDA context or a dead OpenMP thread pool.

Per request (a JSON spec, the worker's fds and the write end of its log pipe, by SCM_RIGHTS) the
child starts its own session, keeps exactly the worker's fds under the numbers its spec names,
applies the environment the host sent, and runs worker.main; the launcher answers the child's pid
and, when it reaps a child, its exit code on the exits socket.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import fcntl
import json
import os
import select
import selectors
import signal
import socket
import sys

from .lifeline import remove_pool_files, watch

MAX_FDS = 8
HOST_GONE_WAIT_S = 0.5  # a closed requests socket: how long to look for the host's death on its lifeline
_PR_SET_PDEATHSIG = 1


def _received(sock: socket.socket) -> tuple[dict, list[int]] | None:
    fds = array.array("i")
    msg, ancdata, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_LEN(MAX_FDS * fds.itemsize))
    if not msg:
        return None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return json.loads(msg), list(fds)


def _become_worker(request: dict, fds: list[int], launcher_pid: int) -> None:
    """In the forked child: the process a fresh ``python -m ...worker`` would be. Never returns."""
    code = 70
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher_pid:  # the launcher died before the line above
            os._exit(code)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        targets = list(request["targets"])
        # Lift every received fd above the targets' numbers first (no dup2 below overwrites one not
        # yet moved), then keep only stdio and the worker's fds: the launcher's sockets are closed.
        lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(targets) + 1) for fd in fds]
        for fd in fds:
            os.close(fd)
        stdin_r, stdin_w = os.pipe()  # as a spawned worker's: a pipe at end-of-file (its spec read)
        os.close(stdin_w)
        os.dup2(stdin_r, 0)
        os.dup2(lifted[0], 1)
        os.dup2(lifted[0], 2)
        for source, target in zip(lifted[1:], targets, strict=True):
            os.dup2(source, target)
        keep = {0, 1, 2, *targets}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [sys.argv[0], *request["labels"]]
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the worker's stdin, at end-of-file
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        from . import worker

        code = worker.main(request["spec"])  # leaves with os._exit
    except BaseException:  # noqa: BLE001 - report and leave; the host sees the exit code
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _send_exit(exits: socket.socket, pid: int, status: int) -> None:
    with contextlib.suppress(OSError):  # the host is gone; the lifeline ends us
        exits.send(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


def _remove_folders(pools: list[tuple[str | None, str | None]]) -> None:
    for folders in list(pools):
        remove_pool_files(*folders)


def _pool_folders(request: dict) -> tuple[str | None, str | None]:
    """The (segment folder, private folder) the worker of ``request`` uses (its spec names them)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        spec = json.loads(request["spec"])
        return spec.get("shm_dir"), spec.get("private_dir")
    return None, None


def serve(
    requests: socket.socket, exits: socket.socket, pools: list[tuple[str | None, str | None]], lifeline: int
) -> None:
    """Fork a worker per request until the host closes the requests socket; each request's pool
    folders are added to ``pools`` (removed when the host dies: by the lifeline's thread, or here
    when the socket's end-of-file, which a dying host also gives, is seen first)."""
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                while True:
                    try:
                        if not os.read(wake_r, 64):
                            break
                    except BlockingIOError:
                        break
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    _send_exit(exits, pid, status)
                continue
            got = _received(requests)
            if got is None:  # the host closed the launcher, or died (then its lifeline ends too)
                if select.select([lifeline], [], [], HOST_GONE_WAIT_S)[0]:
                    _remove_folders(pools)
                os._exit(0)
            request, fds = got
            folders = _pool_folders(request)
            if folders not in pools:
                pools.append(folders)
            pid = os.fork()
            if pid == 0:
                _become_worker(request, fds, me)
            for fd in fds:
                os.close(fd)
            requests.send(json.dumps({"pid": pid}).encode())


def main() -> int:
    setup = json.loads(sys.stdin.read())
    pools: list[tuple[str | None, str | None]] = []  # the folders of the pools it forked workers for
    watch(setup["lifeline"], lambda: _remove_folders(pools))
    import torch  # noqa: F401 - the point of this process: imported once, shared by every fork

    from . import worker, worker_loop  # noqa: F401

    for name in setup.get("preload", ()):
        __import__(name)
    if "torch.cuda" in sys.modules and torch.cuda.is_initialized():
        raise SystemExit("the launcher initialised CUDA: its forks could not use it")
    requests = socket.socket(fileno=setup["requests"])
    exits = socket.socket(fileno=setup["exits"])
    from .protocol import CODE_HASH, PROTOCOL_VERSION

    requests.send(json.dumps({"ready": [PROTOCOL_VERSION, CODE_HASH]}).encode())
    serve(requests, exits, pools, setup["lifeline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
