"""Hung ranks in real processes: a stopped or stalled rank becomes WorkerHung naming it, quickly,
never an error blaming the healthy rank; the next job runs on a fresh pool."""

from __future__ import annotations

import os
import signal
import time

import pytest

from parallel_runtime.errors import WorkerHung
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.builtin_jobs import echo, sleep_steps
from parallel_runtime.runtime.pool import WorkerPool
from parallel_runtime.runtime.watchdog import WatchdogSettings
from tests.dist_jobs.runtime_jobs import stall_on_rank
from tests.leftovers import assert_gone

TWO = ParallelConfig(ulysses=2)
QUICK = WatchdogSettings(stall_min_s=2.0, stall_first_s=2.0)


@pytest.fixture
def pool():
    pool = WorkerPool("cpu:2", TWO, threads_per_worker=1, watchdog=QUICK)
    yield pool.start()
    pool.close()


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def test_a_stopped_rank_fails_the_job_naming_it_within_seconds(pool):
    old_pids, prefix = pool.pids, pool.shm_prefix
    fut = pool.submit(sleep_steps, 10_000, 0.02)
    time.sleep(0.5)
    _stop(old_pids[1])
    t0 = time.monotonic()
    with pytest.raises(WorkerHung) as info:
        fut.result(30)
    assert time.monotonic() - t0 < 3.0
    assert info.value.rank == 1 and "rank 1 is stopped" in str(info.value)
    assert "gloo" not in str(info.value)
    assert_gone(old_pids, prefix, within=2.0)  # a stopped process is killed all the same
    assert pool.submit(echo, "next").result(60) == "next"


def test_cancel_with_a_stopped_rank_ends_in_seconds(pool):
    old_pids, prefix = pool.pids, pool.shm_prefix
    fut = pool.submit(sleep_steps, 10_000, 0.02)
    time.sleep(0.5)
    _stop(pool.pids[0])
    t0 = time.monotonic()
    with pytest.raises((WorkerHung, Exception)):
        fut.wait(should_cancel=lambda: True)
    assert time.monotonic() - t0 < 5.0
    assert_gone(old_pids, prefix, within=3.0)
    assert pool.submit(echo, 1).result(60) == 1


def test_a_stalled_rank_is_blamed_not_the_one_waiting_for_it(pool):
    old_pids, prefix = pool.pids, pool.shm_prefix
    t0 = time.monotonic()
    with pytest.raises(WorkerHung) as info:
        pool.submit(stall_on_rank, 0, 120.0).result(60)
    assert info.value.rank == 0, str(info.value)
    message = str(info.value)
    assert "rank 0 made no progress" in message and "rank(s) 1 waited" in message
    assert time.monotonic() - t0 < 2.0 + 4.0  # the bound (2 s here) plus detection
    assert_gone(old_pids, prefix, within=3.0)
    assert pool.submit(echo, 2).result(60) == 2


def test_a_stopped_idle_worker_is_replaced_before_the_next_job(pool):
    old, prefix = pool.pids, pool.shm_prefix
    _stop(old[0])
    deadline = time.monotonic() + 5.0
    while pool.is_alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pool.is_alive
    assert isinstance(pool.last_failure, WorkerHung) and pool.last_failure.rank == 0
    assert_gone(old, prefix, within=3.0)
    assert pool.submit(echo, 3).result(60) == 3
    assert set(pool.pids).isdisjoint(old)


def test_healthy_slow_steps_are_not_hangs():
    """Steps of 0.6 s with a 2 s floor: the bound follows the measured step time, nothing fires."""
    with WorkerPool("cpu:2", TWO, threads_per_worker=1, watchdog=QUICK) as pool:
        assert pool.submit(sleep_steps, 8, 0.6).result(60) == 8
        assert pool.submit(stall_on_rank, 1, 1.0).result(60) == 2  # 1 s of waiting: under the bound
