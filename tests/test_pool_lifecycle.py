"""Pool life and death in real processes: no network listener, a pool outliving the thread that
started it, host death at any moment of a start, and failure paths bounded to about a second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime import fence, shm
from parallel_runtime.runtime.builtin_jobs import echo, sleep_steps
from parallel_runtime.runtime.pool import WorkerPool
from tests.leftovers import alive, assert_gone, is_loopback, leftovers, listening_sockets

TWO = ParallelConfig(ulysses=2)


def test_nothing_of_the_pool_listens_on_a_network_address():
    before = listening_sockets(os.getpid())
    with WorkerPool("cpu:2", TWO, threads_per_worker=1) as pool:
        assert pool.submit(echo, 1).result(60) == 1
        host_new = sorted(set(listening_sockets(os.getpid())) - set(before))
        workers = {pid: listening_sockets(pid) for pid in pool.pids}
    # the rendezvous needs no listener at all; the workers' collective links stay on loopback
    assert host_new == [], host_new
    exposed = {pid: [a for a in addrs if not is_loopback(a)] for pid, addrs in workers.items()}
    assert all(not addrs for addrs in exposed.values()), exposed
    # what README says: each worker's gloo listener, on 127.0.0.1 (loopback only)
    assert all(addrs and all(a.startswith("127.0.0.1:") for a in addrs) for addrs in workers.values()), workers


def test_pool_outlives_the_thread_that_started_it():
    holder = []
    starter = threading.Thread(target=lambda: holder.append(WorkerPool("cpu:2", TWO, threads_per_worker=1).start()))
    starter.start()
    starter.join()
    pool = holder[0]
    try:
        pids = pool.pids
        time.sleep(3.0)  # PR_SET_PDEATHSIG used to end the workers ~2 s after their starter thread
        assert all(alive(p) for p in pids)
        assert pool.submit(echo, "still here").result(60) == "still here"
        assert pool.starts == 1 and pool.pids == pids
    finally:
        pool.close()


HOST_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.runtime.pool import WorkerPool
    print(os.getpid(), flush=True)
    pool = WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1).start()  # held: alive when killed
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_host_killed_at_any_moment_of_start_leaves_nothing():
    for delay in (0.2, 0.8, 1.6, 3.0):  # before torch is imported, during rendezvous, around READY, idle
        host = subprocess.Popen(
            [sys.executable, "-c", HOST_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        host_pid = int(host.stdout.readline())
        time.sleep(delay)
        prefix = f"dpar-{host_pid}-"
        os.kill(host_pid, signal.SIGKILL)
        host.wait(10)
        t0 = time.monotonic()
        assert_gone([], prefix, within=5.0)
        assert time.monotonic() - t0 < 5.0, f"host killed {delay} s into start: {leftovers([], prefix)}"


DYING_WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    rank = next((a for a in sys.argv if a.startswith("--rank=")), "")
    if rank and os.environ.get("DIE_AFTER_S"):
        if rank == "--rank=1":
            time.sleep(float(os.environ["DIE_AFTER_S"]))
            os._exit(3)
        # rank 0 cannot act on SIGTERM, like a rank blocked inside a gloo or NCCL call
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    """
)

START_SCRIPT = textwrap.dedent(
    """
    import json, os, time
    from parallel_runtime.errors import WorkerDied
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.runtime.pool import WorkerPool
    t0 = time.monotonic()
    try:
        WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1).start()
    except WorkerDied as exc:
        print(json.dumps({"after_s": time.monotonic() - t0, "error": str(exc), "prefix": f"dpar-{os.getpid()}-"}))
    """
)


def test_a_worker_dying_during_start_fails_start_within_a_second(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(DYING_WORKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env["DIE_AFTER_S"] = "2"
    proc = subprocess.run([sys.executable, "-c", START_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    info = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert "rank 1 died with exit code 3" in info["error"]
    # the death comes 2 s after spawn; start() used to add a 3 s SIGTERM grace (and a 5 s graceful wait)
    assert info["after_s"] < 2.0 + 1.5, info["after_s"]
    assert_gone([], info["prefix"], within=1.0)


def test_abort_and_close_are_bounded_to_about_a_second():
    pool = WorkerPool("cpu:2", TWO, threads_per_worker=1).start()
    try:
        old_pids, old_prefix = pool.pids, pool.shm_prefix
        fut = pool.submit(sleep_steps, 10_000, 0.01)
        time.sleep(0.3)
        t0 = time.monotonic()
        pool.abort("test abort")
        assert_gone(old_pids, old_prefix, within=1.0)
        assert time.monotonic() - t0 < 1.0
        assert fut.done() and fut.status == "error"
        assert pool.submit(echo, 2).result(60) == 2
        pids, prefix = pool.pids, pool.shm_prefix
        t0 = time.monotonic()
        pool.close()
        assert time.monotonic() - t0 < 1.5
        assert_gone(pids, prefix, within=0.5)
    finally:
        pool.close()


def test_the_rings_fence_is_a_cpu_barrier():
    """threading.Lock only orders memory for threads taking the same lock; a process on another core
    of a weakly ordered CPU (aarch64) needs a real barrier: libatomic's atomic_thread_fence."""
    assert fence.FENCE_KIND == "libatomic"  # present on this machine (the GCC runtime)
    assert shm.full_fence is fence.full_fence
    kind, _ = fence.resolve_fence("aarch64")
    assert kind == "libatomic"
