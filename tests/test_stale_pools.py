"""A starting pool removes the /dev/shm segments and private folders that pools of dead hosts left
(a host SIGKILLed after its workers were gone leaves them until a reboot); a live host's stay."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.pool import WorkerPool
from parallel_runtime.runtime.stale_pools import sweep_dead_hosts


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no such process now (the kernel reuses pids only after a wrap-around)


def _pool_files(pid: int, shm_dir: Path, tmp_dir: Path) -> list[Path]:
    prefix = f"dpar-{pid}-{uuid.uuid4().hex[:8]}-"
    seg = shm_dir / f"{prefix}ctrl"
    seg.write_bytes(b"\0" * 4096)
    data = shm_dir / f"{prefix}evt0-d3"  # older versions: segments directly in /dev/shm
    data.write_bytes(b"\0" * 10)
    segment_dir = shm_dir / f"{prefix}shm-xyz"  # today: one 0700 folder of segments per pool
    segment_dir.mkdir(mode=0o700)
    (segment_dir / "ctrl").write_bytes(b"\0" * 64)
    folder = tmp_dir / f"{prefix}private-abc"
    folder.mkdir()
    (folder / "store").write_text("x")
    return [seg, data, segment_dir, folder]


def test_sweep_removes_dead_hosts_files_and_keeps_live_ones(tmp_path):
    shm, tmp = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir(), tmp.mkdir()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            dead_files = _pool_files(_dead_pid(), shm, tmp)
            live_files = _pool_files(live.pid, shm, tmp)
            mine = _pool_files(os.getpid(), shm, tmp)
            other = shm / "dpar-small-tmp"  # not a pool's name: never touched
            other.write_text("x")
            removed = sweep_dead_hosts(shm, tmp)
            assert sorted(removed) == sorted(p.name for p in dead_files)
            assert not any(p.exists() for p in dead_files)
            assert all(p.exists() for p in live_files + mine + [other])
        finally:
            live.kill()


def test_a_starting_pool_sweeps_what_a_killed_host_left():
    shm, tmp = Path("/dev/shm"), Path(tempfile.gettempdir())
    dead_files = _pool_files(_dead_pid(), shm, tmp)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        live_files = _pool_files(live.pid, shm, tmp)
        try:
            with WorkerPool("cpu:1", ParallelConfig(), threads_per_worker=1) as pool:
                assert pool.is_alive
            assert not any(p.exists() for p in dead_files)
            assert all(p.exists() for p in live_files)
        finally:
            live.kill()
            for p in live_files:
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()
