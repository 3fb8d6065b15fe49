"""Another local user trying to break a pool: squatting every name it can see or guess.

What a stranger sees of a pool: the entries named ``dpar-<host pid>-<pool id>-...`` in /dev/shm and
the temp folder, and the workers' command lines (``--pool=<label>``). :func:`squat` creates, under
each such label, every name the runtime used to give its segments (``cmd``, ``ctrl``, ``evt<r>``,
``cmd-d<n>``, ``r<r>-<n>``), a directory under the label in /dev/shm and in the temp folder, and
tries to create files inside the folders it sees. :func:`run_as_stranger` runs it as user
``nobody`` when this process is root (a forked child that drops its rights), else as this user,
which can then only squat names outside the pool's folders (inside them it is no stranger).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

STRANGER_UID = 65534  # nobody
SHM = Path("/dev/shm")
LABEL = re.compile(r"dpar-\d+-[0-9a-f]{8}-")
GUESSES = 64  # data segment numbers squatted per writer
RANKS = 8


def visible_labels(host_pid: int) -> list[str]:
    """Pool labels of ``host_pid`` a stranger can read: from /dev/shm, the temp folder and the
    workers' command lines."""
    found: set[str] = set()
    mark = f"dpar-{host_pid}-"
    for folder in (SHM, Path(tempfile.gettempdir())):
        with contextlib.suppress(OSError):
            for entry in folder.iterdir():
                match = LABEL.match(entry.name)
                if match and entry.name.startswith(mark):
                    found.add(match.group(0))
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            for arg in cmdline.read_bytes().split(b"\0"):
                match = LABEL.search(arg.decode(errors="replace"))
                if match and match.group(0).startswith(mark):
                    found.add(match.group(0))
    return sorted(found)


def _guessed_names(label: str) -> list[str]:
    names = [f"{label}cmd", f"{label}ctrl"] + [f"{label}evt{r}" for r in range(RANKS)]
    names += [f"{label}cmd-d{n}" for n in range(1, GUESSES + 1)]
    names += [f"{label}r{r}-{n}" for r in range(RANKS) for n in range(1, GUESSES + 1)]
    return names


def squat(labels: Iterable[str], inside: bool) -> dict[str, Any]:
    """Take every guessable name of the pools ``labels``; with ``inside``, also try to create files
    in the folders of those pools it can see. Returns what it created (``created``: paths outside
    the pools' folders; ``entered``: paths it managed to create inside them)."""
    created, entered = [], []
    for label in labels:
        for name in _guessed_names(label):
            with contextlib.suppress(OSError):
                fd = os.open(SHM / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.close(fd)
                created.append(str(SHM / name))
        for folder in (SHM, Path(tempfile.gettempdir())):
            squatted_dir = folder / f"{label}squat"
            with contextlib.suppress(OSError):
                squatted_dir.mkdir()
                created.append(str(squatted_dir))
            if not inside:
                continue
            for pool_dir in folder.glob(label + "*"):
                if pool_dir == squatted_dir or not pool_dir.is_dir():
                    continue
                for name in ("cmd-d1", "r0-1", "r1-1", "store.squat"):
                    with contextlib.suppress(OSError):
                        fd = os.open(pool_dir / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                        os.close(fd)
                        entered.append(str(pool_dir / name))
    return {"created": created, "entered": entered}


def run_as_stranger(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``fn(*args, inside=stranger)`` in a forked child running as user nobody when this process is
    root (``stranger`` True), else as this user; its JSON-able result plus ``stranger``."""
    stranger = os.geteuid() == 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls and plain Python, then _exit
        code = 1
        try:
            os.close(r)
            if stranger:
                os.setgroups([])
                os.setgid(STRANGER_UID)
                os.setuid(STRANGER_UID)
            out = json.dumps(fn(*args, inside=stranger)).encode()
            while out:
                out = out[os.write(w, out) :]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status != 0 or not chunks:
        raise RuntimeError(f"the stranger's child failed (wait status {status})")
    return {**json.loads(b"".join(chunks)), "stranger": stranger}


def remove_squats(paths: Iterable[str]) -> None:
    """Remove what a squat created (the test's cleanup; as root, whoever owns it)."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
