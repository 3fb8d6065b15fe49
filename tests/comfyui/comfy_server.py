"""A real ComfyUI server from the snapshot, with this pack installed the way a user installs it.

``install_pack`` clones the repository (the commit under test, plus the work tree's uncommitted
changes while developing; CI has none) into ``<base>/custom_nodes/dit-parallel`` and installs its
requirements.txt into ComfyUI's venv: no ``pip install -e .``. ``ComfyServer`` starts ``main.py``
with an isolated ``--base-directory`` (its own custom_nodes, models, input, output, user and
database), waits for it, finds the pack's worker processes, and stops it leaving nothing behind.
Bytecode goes to a cache folder (PYTHONPYCACHEPREFIX), so nothing is written into the snapshot.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from comfy_env import REPO

PACK_FOLDER = "dit-parallel"
WORKER_MODULE_MARK = "parallel_runtime"  # workers run `python -m parallel_runtime...worker <spec>`
SHM_PREFIX = "dpar-"  # the runtime's segment names: dpar-<host pid>-...
START_TIMEOUT_S = 300.0


def _git(*args: str, cwd: Path, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


def clone_pack(dest: Path, repo: Path = REPO) -> str:
    """``git clone`` the repository into ``dest`` at HEAD; uncommitted changes of tracked files and
    untracked, not ignored files are carried over (a developer's run; CI's clone has none).
    Returns the HEAD commit."""
    head = _git("rev-parse", "HEAD", cwd=repo).decode().strip()
    _git("clone", "--quiet", "--no-checkout", str(repo), str(dest), cwd=repo.parent)
    _git("checkout", "--quiet", "--detach", head, cwd=dest)
    diff = _git("diff", "--binary", "HEAD", cwd=repo)
    if diff.strip():
        _git("apply", "--whitespace=nowarn", "-", cwd=dest, stdin=diff)
    for name in _git("ls-files", "--others", "--exclude-standard", "-z", cwd=repo).decode().split("\0"):
        if name:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, dest / name)
    return head


def pip_install_requirements(python: Path, requirements: Path, log_file: Path) -> None:
    """What ComfyUI-Manager does for a node pack: ``pip install -r requirements.txt``."""
    cmd = [str(python), "-m", "pip", "install", "--no-input", "--progress-bar", "off", "-r", str(requirements)]
    with open(log_file, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"pip install -r {requirements} failed (exit {proc.returncode}):\n{tail}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class ComfyServer:
    """One ComfyUI process (``main.py`` of the snapshot) on 127.0.0.1:<port>."""

    python: Path
    snapshot: Path
    base: Path
    env: dict[str, str]
    extra_args: tuple[str, ...] = ()
    launcher: Path | None = None  # a script that runs main.py (its path is the launcher's first argument)
    port: int = 0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    seen_worker_pids: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(self.python),
            *([str(self.launcher)] if self.launcher is not None else []),
            str(self.snapshot / "main.py"),
            "--cpu",
            "--listen",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--base-directory",
            str(self.base),
            "--database-url",
            f"sqlite:///{self.base / 'comfyui.db'}",
            "--preview-method",
            "auto",
            *self.extra_args,
        ]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process and return (``wait_ready`` waits for it to answer)."""
        self.port = free_port()
        self.log_path = self.base / f"comfyui-{self.port}.log"
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.base,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited (code {self.proc and self.proc.returncode}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/queue", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"ComfyUI did not answer on {self.url} within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def worker_pids(self) -> dict[int, int]:
        """rank -> pid of the pack's worker processes that this server started (alive now)."""
        if self.proc is None:
            return {}
        found: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or _parent(int(entry.name)) != self.proc.pid:
                continue
            argv = _cmdline(int(entry.name))
            if (
                len(argv) >= 4
                and argv[1] == "-m"
                and argv[2].startswith(WORKER_MODULE_MARK)
                and pid_alive(int(entry.name))
            ):
                rank = next((a.removeprefix("--rank=") for a in argv[3:] if a.startswith("--rank=")), "")
                with contextlib.suppress(ValueError):
                    found[int(rank)] = int(entry.name)
        self.seen_worker_pids.update(found.values())
        return dict(sorted(found.items()))

    def shm_segments(self) -> list[str]:
        """This server's shared-memory segments (the runtime names them after the host pid)."""
        if self.proc is None:
            return []
        mark = f"{SHM_PREFIX}{self.proc.pid}-"
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith(mark))

    def stop(self, timeout_s: float = 60.0) -> None:
        """Ctrl-C (ComfyUI's own shutdown path, atexit handlers run), then SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.worker_pids()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def leftovers(self, wait_s: float = 30.0) -> tuple[list[int], list[str]]:
        """Worker processes still alive and segments still in /dev/shm after ``stop`` (waits a bit:
        workers notice their parent is gone on their own)."""
        deadline = time.monotonic() + wait_s
        while True:
            alive = sorted(pid for pid in self.seen_worker_pids if pid_alive(pid))
            segments = self.shm_segments()
            if (not alive and not segments) or time.monotonic() > deadline:
                return alive, segments
            time.sleep(0.5)

    def kill_leftovers(self) -> None:
        """Last resort after a failed test: end the workers this server started (by pid) and unlink
        its segments, so one failure does not leak into the machine."""
        for pid in self.seen_worker_pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for name in self.shm_segments():  # a pool's segment folder (older versions: its segments)
            path = f"/dev/shm/{name}"
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
