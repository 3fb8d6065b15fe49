"""Worker-side jobs for the launcher tests: what a worker process looks like from inside."""

from __future__ import annotations

import os
import stat

import torch


def _kind(fd: int) -> str:
    mode = os.fstat(fd).st_mode
    for name, test in (("pipe", stat.S_ISFIFO), ("socket", stat.S_ISSOCK), ("file", stat.S_ISREG)):
        if test(mode):
            return name
    return "other"


def describe_process(ctx) -> dict:
    """The process's session, environment for the collectives and threads, CPU affinity, torch's
    thread count and its inherited descriptors (number -> kind; files and sockets the worker opened
    itself are left out: shared memory and gloo's own)."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            kind = _kind(fd)
        except OSError:
            continue
        if kind == "pipe" or fd <= 2:
            fds[fd] = kind
    return {
        "own_session": os.getsid(0) == os.getpid(),
        "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS")},
        "pythonpath_first": os.environ.get("PYTHONPATH", "").split(os.pathsep)[0],
        "affinity": sorted(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "fds": fds,
    }
