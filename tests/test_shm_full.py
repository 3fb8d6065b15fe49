"""A full /dev/shm, in a private mount namespace with a small tmpfs (root only; elsewhere skipped
with the reason): messages that do not fit go through the pool's private folder instead of
killing the writer with SIGBUS, and when that is full too the error names /dev/shm and
docker's --shm-size."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from dit_devtools.faults.shm_cells import namespace_problem

REASON = namespace_problem()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def _run_small_shm(script: str, shm_mb: int, tmp_mb: int | None = None) -> dict:
    """Run ``script`` (prints one JSON line) with /dev/shm of ``shm_mb`` MiB, and with TMPDIR on a
    tmpfs of ``tmp_mb`` MiB when given (the pool's private folder lives there)."""
    mounts = [f"mount -t tmpfs -o size={shm_mb}m tmpfs /dev/shm"]
    env = dict(os.environ)
    if tmp_mb is not None:
        mounts.append(f"mkdir -p /tmp/dpar-small-tmp && mount -t tmpfs -o size={tmp_mb}m tmpfs /tmp/dpar-small-tmp")
        env["TMPDIR"] = "/tmp/dpar-small-tmp"
    command = " && ".join([*mounts, f"exec {shlex.quote(sys.executable)} -c {shlex.quote(script)}"])
    proc = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


SCRIPT = textwrap.dedent(
    """
    import json, logging, io, torch
    from parallel_runtime.errors import SharedMemoryFull
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.runtime.builtin_jobs import echo, tensor_sink
    from parallel_runtime.runtime.pool import WorkerPool
    log = io.StringIO()
    logging.basicConfig(stream=log, level=logging.WARNING)
    out = {}
    with WorkerPool("cpu:1", ParallelConfig(), threads_per_worker=1) as pool:
        big = torch.arange(4 << 20, dtype=torch.int32)  # 16 MiB: more than /dev/shm holds
        try:
            out["sink"] = pool.submit(tensor_sink, big).result(120)["nbytes"]  # host -> worker
            out["echo"] = bool(torch.equal(pool.submit(echo, big).result(120), big))  # both ways
        except SharedMemoryFull as exc:
            out["error"] = str(exc)
        out["small_after"] = pool.submit(echo, 7).result(60)
    out["log"] = log.getvalue()
    print(json.dumps(out))
    """
)


def test_messages_larger_than_dev_shm_go_through_the_private_folder():
    out = _run_small_shm(SCRIPT, shm_mb=12)  # used to kill the host with SIGBUS
    assert out.get("error") is None, out
    assert out["sink"] == 16 << 20 and out["echo"] is True and out["small_after"] == 7
    assert "/dev/shm" in out["log"] and "--shm-size" in out["log"]


def test_when_nothing_has_room_the_error_names_dev_shm_and_shm_size():
    out = _run_small_shm(SCRIPT, shm_mb=12, tmp_mb=8)
    assert "/dev/shm" in out["error"] and "--shm-size" in out["error"] and "fix:" in out["error"]
    assert out["small_after"] == 7  # the pool is still usable for what fits


START_SCRIPT = textwrap.dedent(
    """
    import json, logging, io
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.runtime.builtin_jobs import echo
    from parallel_runtime.runtime.pool import WorkerPool
    log = io.StringIO()
    logging.basicConfig(stream=log, level=logging.WARNING)
    with WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1) as pool:
        out = {"echo": pool.submit(echo, 7).result(60)}
        payload = bytes(range(256)) * 800  # 200 KiB a message, 8 round trips: far more than 1 MiB in all
        out["big"] = all(pool.submit(echo, payload).result(60) == payload for _ in range(8))
    out["log"] = log.getvalue()
    print(json.dumps(out))
    """
)


def test_a_pool_starts_when_its_queues_do_not_fit_dev_shm():
    """1 MiB of /dev/shm cannot hold the pool's rings (2 MiB each): they go to the private folder
    with one warning naming /dev/shm and --shm-size, and messages of 200 KiB go through, instead of
    the host or a worker dying with SIGBUS when a page of a ring or segment is first touched."""
    out = _run_small_shm(START_SCRIPT, shm_mb=1)
    assert out["echo"] == 7 and out["big"] is True
    assert "/dev/shm has" in out["log"] and "--shm-size" in out["log"]
