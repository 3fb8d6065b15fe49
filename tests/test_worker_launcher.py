"""The worker launcher (runtime/launcher.py): a pre-imported process forks each CPU worker. A forked
worker must be indistinguishable from a spawned one, and every lifetime guarantee must hold: a host
killed at any moment (the launcher forking included) leaves no launcher, worker or segment; a killed
launcher fails its pools, which restart by spawning; code changed on disk is still a VersionSkew."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from leftovers import alive, private_dirs, segments
from test_protocol import _package_copy

from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.launcher import ForkedWorker, WorkerLauncher
from parallel_runtime.runtime.pool import WorkerPool
from tests.dist_jobs.launcher_jobs import describe_process
from tests.dist_jobs.runtime_jobs import stall_on_rank

TWO = ParallelConfig(ulysses=2)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def launcher():
    launcher = WorkerLauncher().start()
    yield launcher
    launcher.close()
    assert launcher.proc.returncode == 0


def _gone(pids, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_a_forked_worker_equals_a_spawned_one(launcher):
    described = {}
    for how in ("spawned", "forked"):
        with WorkerPool("cpu:2", TWO, threads_per_worker=1, launcher=launcher if how == "forked" else None) as pool:
            kinds = {type(p) for p in pool._runtime.procs}
            assert kinds == ({ForkedWorker} if how == "forked" else {subprocess.Popen})
            described[how] = pool.run(describe_process, result_rank="all")
            assert all(os.getsid(pid) == pid for pid in pool.pids)  # each leads its own session
    spawned, forked = described["spawned"], described["forked"]
    for rank in range(2):
        assert forked[rank]["own_session"] and spawned[rank]["own_session"]
        assert (
            forked[rank]["env"]
            == spawned[rank]["env"]
            == {
                "GLOO_SOCKET_IFNAME": "lo",
                "NCCL_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            }
        )
        assert forked[rank]["pythonpath_first"] == spawned[rank]["pythonpath_first"] == str(ROOT)
        assert forked[rank]["affinity"] == spawned[rank]["affinity"]
        assert forked[rank]["torch_threads"] == spawned[rank]["torch_threads"] == 1
        # stdin, the log pipe, the two doorbells and the death pipe: the same numbers and kinds
        assert forked[rank]["fds"] == spawned[rank]["fds"], (forked[rank]["fds"], spawned[rank]["fds"])


def test_a_killed_launcher_fails_its_pool_which_restarts_by_spawning():
    launcher = WorkerLauncher().start()
    try:
        pool = WorkerPool("cpu:2", TWO, threads_per_worker=1, launcher=launcher).start()
        with pool:
            forked = pool.pids
            launcher.proc.kill()
            assert _gone(forked) == []  # PR_SET_PDEATHSIG: the launcher's children go with it
            assert pool.run(stall_on_rank, 0, 0.0) == 2  # restarted, now by spawning
            assert {type(p) for p in pool._runtime.procs} == {subprocess.Popen}
            assert pool.starts == 2
    finally:
        launcher.close()


HOST = textwrap.dedent(
    """
    import json, os, sys, threading
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.runtime.launcher import WorkerLauncher
    from parallel_runtime.runtime.pool import WorkerPool
    launcher = WorkerLauncher().start()
    print(json.dumps({"launcher": launcher.proc.pid}), flush=True)
    pool = WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1, launcher=launcher)
    if sys.argv[1] == "start":
        pool.start()
        print(json.dumps({"workers": pool.pids, "prefix": pool._runtime.prefix}), flush=True)
    sys.stdin.read()  # held until killed
    """
)


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        found = []
        for tid in tasks:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        return found
    except OSError:
        return []


@pytest.mark.parametrize("moment", ["launcher idle", "while it forks", "pool running"])
def test_a_host_killed_at_any_moment_leaves_no_launcher_and_no_worker(moment):
    before_segments, before_dirs = set(segments("dpar-")), set(private_dirs("dpar-"))
    host = subprocess.Popen(
        [sys.executable, "-c", HOST, "start" if moment != "launcher idle" else "idle"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        launcher_pid = json.loads(host.stdout.readline())["launcher"]
        workers: list[int] = []
        if moment == "while it forks":
            deadline = time.monotonic() + 60
            while not (workers := _children(launcher_pid)) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert workers, "the launcher forked nothing"
        elif moment == "pool running":
            workers = json.loads(host.stdout.readline())["workers"]
        host.kill()
        host.wait()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
    assert _gone([launcher_pid, *workers]) == []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        set(segments(f"dpar-{host.pid}-")) - before_segments or set(private_dirs(f"dpar-{host.pid}-")) - before_dirs
    ):
        time.sleep(0.05)
    assert not set(segments(f"dpar-{host.pid}-")) - before_segments
    assert not set(private_dirs(f"dpar-{host.pid}-")) - before_dirs


CHANGED = textwrap.dedent(
    """
    import sys
    from parallel_runtime.errors import VersionSkew
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.runtime.launcher import ForkedWorker, WorkerLauncher
    from parallel_runtime.runtime.pool import WorkerPool
    launcher = WorkerLauncher().start()
    with WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1, launcher=launcher) as pool:
        assert {type(p) for p in pool._runtime.procs} == {ForkedWorker}
    with open(sys.argv[1], "a") as f:
        f.write("\\n# edited while the host and its launcher ran\\n")
    try:
        WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1, launcher=launcher).start()
    except VersionSkew as exc:
        print("VersionSkew", exc.rank)
    launcher.close()
    """
)


def test_code_changed_on_disk_after_the_launcher_started_is_a_version_skew(tmp_path):
    copy = _package_copy(tmp_path)
    edited = copy / "parallel_runtime" / "runtime" / "builtin_jobs.py"
    done = subprocess.run(
        [sys.executable, "-c", CHANGED, str(edited)],
        cwd=copy,
        env={**os.environ, "PYTHONPATH": str(copy)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "VersionSkew" in done.stdout, done.stdout + done.stderr[-3000:]
