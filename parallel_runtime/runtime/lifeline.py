"""The death pipe: a worker exits when the host *process* is gone, whichever thread started it.

The host makes a pipe per pool, keeps the write end (it never writes to it) and gives each worker
the read end. When the host process ends — normally, killed with SIGKILL, crashed — the kernel
closes the write end and every worker's read sees end-of-file. A watcher thread blocked in that
read then removes what the host can no longer remove (the pool's shared-memory folder and its
private rendezvous folder) and ends the process.

``PR_SET_PDEATHSIG`` is not used: it fires when the *thread* that started the worker exits (web
servers and thread pools start work in short-lived threads). This module imports only the
standard library, so a worker arms it before importing torch (which takes seconds); a host that
dies even before that is seen at once (the pipe is already at end-of-file).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable


def make_death_pipe() -> tuple[int, int]:
    """Host side: (read_fd for the workers, write_fd the host keeps open). Both are close-on-exec;
    a worker gets the read end only through ``pass_fds``."""
    return os.pipe()


def remove_pool_files(shm_dir: str | None, private_dir: str | None) -> None:
    """Remove the pool's segment folder and its private folder (both 0700, the pool's own). Used
    when the host is gone: nobody else will. Never raises."""
    for folder in (shm_dir, private_dir):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def _watch(fd: int, on_host_gone: Callable[[], None]) -> None:
    while True:
        try:
            data = os.read(fd, 1)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:  # end-of-file: the host process is gone
            try:
                on_host_gone()
            finally:
                os._exit(0)


def watch(fd: int, on_host_gone: Callable[[], None]) -> threading.Thread:
    """Watch the death pipe ``fd`` from a daemon thread: when the host dies, run ``on_host_gone``
    (it must not raise) and exit at once (no interpreter shutdown: the main thread may be blocked
    in a collective that will never complete)."""
    os.set_blocking(fd, True)
    thread = threading.Thread(target=_watch, args=(fd, on_host_gone), name="dpar-lifeline", daemon=True)
    thread.start()
    return thread


def arm(fd: int, shm_dir: str | None, private_dir: str | None) -> threading.Thread:
    """Worker side: when the host dies, remove the pool's files and exit at once (``watch``)."""
    return watch(fd, lambda: remove_pool_files(shm_dir, private_dir))
