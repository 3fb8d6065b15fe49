"""Another local user cannot break a pool's jobs nor its cleanup by taking the names of its
shared-memory segments: every segment lives in a 0700 folder of the pool's own (created with a
random name), the workers' command lines name no folder, and cleanup removes that folder and the
private one — nothing of anyone else's, and without raising for what it finds there.

As root the squatter is a forked child running as user nobody (a real stranger); elsewhere it is
this user, squatting every name outside the pool's folders."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dit_devtools.faults.stranger import remove_squats, run_as_stranger, squat, visible_labels
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.builtin_jobs import echo
from parallel_runtime.runtime.pool import WorkerPool
from parallel_runtime.runtime.segments import sweep_segments


def test_squatting_every_visible_or_guessable_name_breaks_no_job_and_no_cleanup():
    pool = WorkerPool("cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1).start()
    squats: list[str] = []
    try:
        rt = pool._runtime
        shm_dir, private_dir = rt.shm_dir, rt.private_dir
        first = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB each way: data segments, not ring slots
        assert torch.equal(pool.submit(echo, first).result(60), first)

        assert pool.shm_prefix in visible_labels(os.getpid())  # the stranger does see the pool
        report = run_as_stranger(squat, [pool.shm_prefix])
        squats = report["created"] + report["entered"]
        assert len(report["created"]) > 500  # it took every name the runtime used to give its segments
        if report["stranger"]:
            assert report["entered"] == []  # and none inside the pool's folders

        for n in range(2, 6):  # bigger each time: every job needs new segments on the host and the workers
            value = torch.full((n << 18,), float(n))
            assert torch.equal(pool.submit(echo, value).result(60), value)

        for pid in pool.pids:  # a stranger reads command lines: they name no folder of the pool
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert shm_dir not in cmdline and private_dir not in cmdline and "store" not in cmdline
        assert Path(shm_dir).parent == Path("/dev/shm") and (Path(shm_dir).stat().st_mode & 0o777) == 0o700
    finally:
        pool.close()  # must not raise for the squatted directories and files
        still_there = [p for p in squats if os.path.lexists(p)]
        remove_squats(squats)
    assert not os.path.exists(shm_dir) and not os.path.exists(private_dir)
    assert sorted(still_there) == sorted(squats)  # what is not the pool's was not touched


def test_sweeping_a_dead_workers_segments_skips_what_is_not_a_segment_of_ours(tmp_path):
    (tmp_path / "r1-1").write_bytes(b"x")
    (tmp_path / "r1-2").mkdir()  # a directory under a segment's name
    (tmp_path / "r1-3").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "r0-1").write_bytes(b"x")  # another rank's
    assert sweep_segments(str(tmp_path), "r1-") == ["r1-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0-1", "r1-2", "r1-3"]
    assert sweep_segments(str(tmp_path / "missing"), "r1-") == []
