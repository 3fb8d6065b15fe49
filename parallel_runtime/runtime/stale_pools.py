"""Removing what pools of dead hosts left behind, when a new pool starts.

Every pool names its /dev/shm folder (older versions: its segments) and its private folder
``dpar-<host pid>-<id>-...``. The host
removes them when a pool ends, and a worker whose host died removes them too (lifeline.py); but a
host SIGKILLed while its workers were already gone (or never started) leaves them, RAM-backed, until
the next reboot. So a starting pool removes every ``dpar-<pid>-`` entry of *this user* whose pid is
not a live process. A live pid keeps its entries, whoever it is (a reused pid only delays cleanup).

/dev/shm shared between pid namespaces (two containers with ``--ipc=host``) would make another
container's live host look dead here: such setups should give each container its own /dev/shm
(Docker's default).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from .segments import SHM_DIR

POOL_NAME = re.compile(r"^dpar-(\d+)-[0-9a-f]{8}-")  # dpar-<host pid>-<pool id>-...


def host_alive(pid: int) -> bool:
    """True if ``pid`` is a live process (a zombie is dead: it runs no more code)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead_host_entries(folder: Path) -> list[Path]:
    uid = os.geteuid()
    dead: dict[int, bool] = {}
    found = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for path in entries:
        match = POOL_NAME.match(path.name)
        if match is None:
            continue
        try:
            if path.lstat().st_uid != uid:
                continue  # another user's pool: not ours to judge (nor to remove)
        except OSError:
            continue
        pid = int(match.group(1))
        if pid not in dead:
            dead[pid] = pid != os.getpid() and not host_alive(pid)
        if dead[pid]:
            found.append(path)
    return found


def sweep_dead_hosts(shm_dir: str | os.PathLike = SHM_DIR, tmp_dir: str | os.PathLike | None = None) -> list[str]:
    """Remove the segments (in ``shm_dir``) and private folders (in ``tmp_dir``, the temp folder by
    default) of pools whose host process no longer exists. Returns the names removed."""
    removed = []
    for folder in (Path(shm_dir), Path(tmp_dir or tempfile.gettempdir())):
        for path in _dead_host_entries(folder):
            with contextlib.suppress(OSError):  # gone meanwhile, or not removable: never our problem to raise
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(path.name)
    return removed
