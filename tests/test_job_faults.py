"""Back-to-back failures, undecodable messages and cancel of queued jobs, in real processes: each
ends fast with an error naming what happened, and the next job runs."""

from __future__ import annotations

import logging
import sys
import time
import types

import pytest

from parallel_runtime.errors import JobCancelled, WorkerError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.builtin_jobs import echo, sleep_steps
from tests.dist_jobs.runtime_jobs import fail_then_collective, undecodable_event, undecodable_result
from tests.leftovers import assert_gone

TWO = ParallelConfig(ulysses=2)


def test_a_valid_job_right_after_a_failure_runs(cpu_pool):
    pool = cpu_pool(TWO)
    old_pids, old_prefix = pool.pids, pool.shm_prefix
    with pytest.raises(WorkerError, match="deliberate failure on rank 1"):
        pool.submit(fail_then_collective, 1).result(30)
    # rank 0 is still stuck in the all-reduce rank 1 never entered: this job must not land behind it
    assert pool.submit(echo, "fine").result(60) == "fine"
    assert "fail_then_collective" in str(pool.last_failure)  # the stranded pool was replaced first
    assert_gone(old_pids, old_prefix, within=3.0)


def test_an_undecodable_result_fails_its_job_once_and_the_pool_goes_on(cpu_pool, caplog):
    pool = cpu_pool(TWO)
    caplog.set_level(logging.ERROR, logger="parallel_runtime")
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        pool.submit(undecodable_result, 0).result(10)
    assert time.monotonic() - t0 < 2.0
    assert info.value.rank == 0 and "could not be decoded" in str(info.value)
    assert "dpar_test_worker_only_module" in str(info.value) and "fix:" in str(info.value)
    assert pool.submit(echo, "after").result(10) == "after"
    with pytest.raises(WorkerError, match="rank 1.*could not be decoded"):
        pool.submit(undecodable_event, 1).result(10)
    assert pool.submit(echo, "again").result(10) == "again"
    assert len(caplog.records) <= 4, [r.getMessage() for r in caplog.records]


def test_a_job_the_workers_cannot_decode_fails_on_every_rank_and_the_pool_goes_on(cpu_pool):
    pool = cpu_pool(TWO)
    host_only = types.ModuleType("dpar_test_host_only_module")

    class OnlyHere:
        pass

    OnlyHere.__module__, OnlyHere.__qualname__ = host_only.__name__, "OnlyHere"
    host_only.OnlyHere = OnlyHere
    sys.modules[host_only.__name__] = host_only
    try:
        with pytest.raises(WorkerError, match="could not be decoded"):
            pool.submit(echo, OnlyHere()).result(10)
    finally:
        del sys.modules[host_only.__name__]
    assert pool.submit(echo, "ok").result(10) == "ok"


def test_cancelling_a_queued_job_does_not_wait_for_the_running_one(cpu_pool):
    pool = cpu_pool(TWO)
    running = pool.submit(sleep_steps, 40, 0.05)
    queued = pool.submit(sleep_steps, 40, 0.05)
    time.sleep(0.2)
    t0 = time.monotonic()
    queued.cancel()
    with pytest.raises(JobCancelled):
        queued.result(10)
    assert time.monotonic() - t0 < 0.5
    assert not running.done()
    assert running.result(30) == 40  # the running job is not affected


def test_two_cancels_do_not_erase_each_other(cpu_pool):
    pool = cpu_pool(TWO)
    first = pool.submit(sleep_steps, 10_000, 0.01)
    second = pool.submit(sleep_steps, 10_000, 0.01)
    time.sleep(0.2)
    first.cancel()
    second.cancel()  # used to overwrite the one cancel slot: the running job never saw its cancel
    for fut in (first, second):
        with pytest.raises(JobCancelled):
            fut.result(5)
    assert pool.submit(echo, 5).result(10) == 5
