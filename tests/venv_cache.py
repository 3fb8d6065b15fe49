"""Python environments that some tests need besides the test venv (ComfyUI's own; the lowest
declared torch), built once under a lock in ~/.cache/dit-parallel/ and reused by later runs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

log = logging.getLogger("dit_parallel.tests.venvs")
READY_MARK = ".dit-parallel-ready"
BUILD_TIMEOUT_S = 3600


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dit-parallel"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def key_of(*parts: str) -> str:
    """A short key for what a venv holds (the pins and this Python's version)."""
    return hashlib.sha1("\n".join([*parts, sys.version.split()[0]]).encode()).hexdigest()[:10]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # another test run building the same venv: wait for it
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pip_install(python: Path, args: Sequence[str], log_file: Path) -> None:
    cmd = [str(python), "-m", "pip", "install", "--no-input", "--progress-bar", "off", *args]
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}); last lines of {log_file}:\n{tail}")


def cached_venv(target: Path, installs: Sequence[Sequence[str]]) -> Path:
    """The python of the venv ``target``, created with one ``pip install`` per entry of ``installs``
    unless a finished build is there already (an interrupted one is built again)."""
    with _locked(target.with_name(target.name + ".lock")):
        if (target / READY_MARK).is_file():
            return venv_python(target)
        if target.exists():
            shutil.rmtree(target)
        t0 = time.monotonic()
        log_file = target.with_name(target.name + ".log")
        log_file.write_text(f"building {target}\n")
        log.warning("building the venv %s (once; log: %s)", target, log_file)
        subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=600)
        for args in installs:
            pip_install(venv_python(target), args, log_file)
        seconds = time.monotonic() - t0
        (target / READY_MARK).write_text(f"built in {seconds:.0f} s\n")
        log.warning("venv %s ready in %.0f s", target, seconds)
        return venv_python(target)
