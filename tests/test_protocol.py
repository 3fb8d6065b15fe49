"""The host <-> worker protocol: a strictly read spec, a version check on both sides (real worker
processes started from an edited copy of the package), and a monitor thread that never dies silently."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import re
import shutil
import time
from pathlib import Path

import pytest

from parallel_runtime.errors import ConfigError, MonitorFailed, ProtocolError, VersionSkew
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime import protocol, spawn
from parallel_runtime.runtime.builtin_jobs import echo
from parallel_runtime.runtime.pool import WorkerPool
from parallel_runtime.runtime.protocol import CODE_HASH, PROTOCOL_VERSION, WorkerSpec, package_code_hash
from parallel_runtime.runtime.settings import RuntimeSettings
from tests.dist_jobs import protocol_jobs
from tests.leftovers import assert_gone, processes_mentioning, segments

TWO = ParallelConfig(ulysses=2)
PROMPT_S = 10.0  # a version error must come this soon (the start timeout is 180 s)


def _spec(**changes) -> WorkerSpec:
    spec = WorkerSpec(
        protocol=PROTOCOL_VERSION,
        code=CODE_HASH,
        rank=1,
        world_size=2,
        device="cpu",
        config=TWO,
        threads=1,
        cpus=(0, 1),
        parent_pid=os.getpid(),
        shm_dir="/dev/shm/dpar-test-shm-x",
        private_dir="/tmp/x",
        store_path="/tmp/x/store",
        cmd_ring="dpar-test-cmd",
        cmd_doorbell_r=5,
        evt_ring="dpar-test-evt1",
        evt_doorbell_w=6,
        control="dpar-test-ctrl",
        death_fd=7,
        setup=("tests.dist_jobs.protocol_jobs:pretend_other_code", (1,)),
        settings=RuntimeSettings(start_timeout_s=12.0),
    )
    return dataclasses.replace(spec, **changes)


def test_the_spec_round_trips_through_its_json():
    spec = _spec()
    assert WorkerSpec.from_json(spec.to_json()) == spec
    assert WorkerSpec.from_json(_spec(setup=None, cpus=None).to_json()) == _spec(setup=None, cpus=None)


def _edited(spec: WorkerSpec, edit) -> str:
    data = json.loads(spec.to_json())
    edit(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d.pop("death_fd"), "spec has missing death_fd"),
        (lambda d: d.update(env={}), "spec has unknown env"),
        (lambda d: d["settings"]["watchdog"].pop("beat_s"), "spec.settings.watchdog has missing beat_s"),
        (lambda d: d["config"].update(ulysses=0), "ulysses degree is 0"),
        (lambda d: d.update(settings=[]), "spec.settings is a list"),
    ],
)
def test_a_malformed_spec_is_a_clear_error_not_a_key_error(edit, needle):
    with pytest.raises(ProtocolError) as info:
        WorkerSpec.from_json(_edited(_spec(), edit))
    assert not isinstance(info.value, VersionSkew)
    msg = str(info.value)
    assert needle in msg and "why:" in msg and "fix:" in msg


def test_a_spec_from_another_version_names_both_versions():
    with pytest.raises(VersionSkew) as info:
        WorkerSpec.from_json(_spec(protocol=PROTOCOL_VERSION + 1, code="feedfacecafebeef").to_json())
    err = info.value
    assert err.rank == 1
    assert err.host == (PROTOCOL_VERSION + 1, "feedfacecafebeef") and err.worker == (PROTOCOL_VERSION, CODE_HASH)
    msg = str(err)
    assert f"code feedfacecafebeef (protocol {PROTOCOL_VERSION + 1})" in msg
    assert f"code {CODE_HASH} (protocol {PROTOCOL_VERSION})" in msg and "restart" in msg
    # the untyped protocol's spec (a dict with no version) is named as such, not a KeyError
    with pytest.raises(VersionSkew, match="before protocol 2"):
        WorkerSpec.from_json(json.dumps({"rank": 0, "death_fd": 7, "prefix": "dpar-x-"}))


MESSAGES = [
    protocol.RunJob(3, "m:f", (1, "a"), {"k": None}, "all"),
    protocol.Shutdown(),
    protocol.Ready(1, PROTOCOL_VERSION, CODE_HASH, {"pid": 5}),
    protocol.Event(3, 1, "progress", {"step": 2}),
    protocol.Result(3, 0, "ok", [1.5]),
    protocol.Result(3, 1, "error", error=protocol.RemoteError("ValueError", "bad", "Traceback ...")),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_the_wire(msg):
    expected = (*protocol.HOST_TO_WORKER, *protocol.WORKER_TO_HOST)
    back = protocol.from_wire(pickle.loads(pickle.dumps(protocol.to_wire(msg))), "rank 1", expected)
    assert type(back) is type(msg) and back == msg


@pytest.mark.parametrize(
    "wire, needle",
    [
        (("result", 3, 0, "ok", 1), "rank 1 sent a tuple tagged 'result' of 5 items"),  # the untyped protocol
        ((protocol.Result.TAG, 3, 0, "ok", 1, None, "a field of a later version"), "tagged 5 of 7 items"),
        ((protocol.RunJob.TAG, 3, "m:f", (), {}, 0), "tagged 1 of 6 items"),  # a command, not a worker's message
        ({"job": 3}, "rank 1 sent a dict"),
    ],
)
def test_a_malformed_message_is_a_protocol_error(wire, needle):
    with pytest.raises(ProtocolError) as info:
        protocol.from_wire(wire, "rank 1", protocol.WORKER_TO_HOST)
    assert needle in str(info.value) and "Ready, Event, Result" in str(info.value)


def test_a_ready_of_another_shape_still_names_its_version():
    wire = (protocol.Ready.TAG, 1, PROTOCOL_VERSION + 1, "feedfacecafebeef", {"pid": 5}, "a new field")
    ready = protocol.from_wire(wire, "rank 1", protocol.WORKER_TO_HOST)
    skew = protocol.ready_error(ready)
    assert isinstance(skew, VersionSkew) and skew.rank == 1
    assert skew.worker == (PROTOCOL_VERSION + 1, "feedfacecafebeef")
    assert protocol.ready_error(MESSAGES[2]) is None


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"start_timeout": 60}, "unknown pool option(s) start_timeout"),
        ({"job_timeout_s": 0}, "job_timeout_s=0"),
        ({"threads_per_worker": 0}, "threads_per_worker=0"),
        ({"log_level": "LOUD"}, "log_level='LOUD'"),
    ],
)
def test_pool_options_are_checked_runtime_settings(options, needle):
    with pytest.raises(ConfigError) as info:
        WorkerPool("cpu:2", TWO, **options)
    assert needle in str(info.value) and "fix:" in str(info.value)
    pool = WorkerPool("cpu:2", TWO, settings=RuntimeSettings(start_timeout_s=60.0), job_timeout_s=9.0, watchdog=None)
    assert (pool.settings.start_timeout_s, pool.settings.job_timeout_s) == (60.0, 9.0)
    assert pool.settings.watchdog == RuntimeSettings().watchdog and pool.pids == []


def test_the_code_hash_follows_every_python_file(tmp_path):
    copy = _package_copy(tmp_path)
    assert package_code_hash(copy / "parallel_runtime") == CODE_HASH  # the same files, wherever they are
    with open(copy / "parallel_runtime" / "runtime" / "builtin_jobs.py", "a") as f:
        f.write("\n# an edit\n")
    assert package_code_hash(copy / "parallel_runtime") != CODE_HASH
    t0 = time.perf_counter()
    package_code_hash()
    assert time.perf_counter() - t0 < 1.0  # (about 5 ms: see the report; a loose bound for a busy machine)


# -- real workers started from other code ------------------------------------------------------------


def _package_copy(root: Path) -> Path:
    """The package's .py files under ``root``/parallel_runtime (what a worker imports)."""
    for path in protocol.PACKAGE_DIR.rglob("*.py"):
        target = root / "parallel_runtime" / path.relative_to(protocol.PACKAGE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return root


def _mine() -> dict[str, set]:
    prefix = f"dpar-{os.getpid()}-"
    return {"processes": set(processes_mentioning(prefix)), "segments": set(segments(prefix))}


def _assert_nothing_new(before: dict[str, set], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while True:
        new = {k: v - before[k] for k, v in _mine().items()}
        if not any(new.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not any(new.values()), new


def _start_from(copy: Path, monkeypatch, caplog) -> tuple[BaseException, float]:
    """Start a 2-rank pool whose workers import the package at ``copy``: (the error, seconds to it).
    The workers must have refused their spec themselves (not been caught later, at READY)."""
    caplog.set_level(logging.DEBUG, logger="parallel_runtime.worker")  # every line a worker prints
    monkeypatch.setattr(spawn, "PACKAGE_ROOT", str(copy))
    monkeypatch.chdir(copy)  # python -m puts the working folder first on the path
    pool = WorkerPool("cpu:2", TWO, threads_per_worker=1, start_timeout_s=180.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(VersionSkew) as info:
            pool.start()
        seconds = time.monotonic() - t0
    finally:
        pool.close()
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith(protocol.REFUSAL_PREFIX)]
    assert refusals, "no worker refused its spec"
    return info.value, seconds


def test_a_worker_of_another_protocol_version_refuses_at_once(tmp_path, monkeypatch, caplog):
    copy = _package_copy(tmp_path)
    source = copy / "parallel_runtime" / "runtime" / "protocol.py"
    new = f"PROTOCOL_VERSION = {PROTOCOL_VERSION + 1}"
    text, n = re.subn(r"^PROTOCOL_VERSION = \d+$", new, source.read_text(), count=1, flags=re.M)
    assert n == 1
    source.write_text(text)
    before = _mine()
    err, seconds = _start_from(copy, monkeypatch, caplog)
    worker_code = package_code_hash(copy / "parallel_runtime")
    assert err.host == (PROTOCOL_VERSION, CODE_HASH) and err.worker == (PROTOCOL_VERSION + 1, worker_code)
    assert err.rank in (0, 1) and seconds < PROMPT_S
    msg = str(err)
    assert f"protocol {PROTOCOL_VERSION})" in msg and f"protocol {PROTOCOL_VERSION + 1})" in msg
    assert "why:" in msg and "restart ComfyUI" in msg
    _assert_nothing_new(before)


def test_a_worker_of_other_code_refuses_at_once(tmp_path, monkeypatch, caplog):
    copy = _package_copy(tmp_path)
    with open(copy / "parallel_runtime" / "runtime" / "builtin_jobs.py", "a") as f:
        f.write("\n\ndef added_while_the_host_ran(ctx):\n    return 1\n")
    before = _mine()
    err, seconds = _start_from(copy, monkeypatch, caplog)
    worker_code = package_code_hash(copy / "parallel_runtime")
    assert worker_code != CODE_HASH
    assert err.host == (PROTOCOL_VERSION, CODE_HASH) and err.worker == (PROTOCOL_VERSION, worker_code)
    assert seconds < PROMPT_S
    assert f"code {CODE_HASH}" in str(err) and f"code {worker_code}" in str(err)
    _assert_nothing_new(before)


def test_a_ready_from_other_code_fails_the_pool_at_once():
    """A worker that does not refuse (no check of its own) is caught at READY by the host."""
    before = _mine()
    pool = WorkerPool("cpu:2", TWO, threads_per_worker=1, worker_setup=(protocol_jobs.pretend_other_code, (1,)))
    t0 = time.monotonic()
    try:
        with pytest.raises(VersionSkew) as info:
            pool.start()
        seconds = time.monotonic() - t0
    finally:
        pool.close()
    err = info.value
    assert err.rank == 1 and err.worker == (PROTOCOL_VERSION, protocol_jobs.OTHER_CODE)
    assert err.host == (PROTOCOL_VERSION, CODE_HASH) and seconds < 60.0  # a normal start, not the 180 s timeout
    _assert_nothing_new(before)


# -- the monitor thread never dies silently ---------------------------------------------------------


@pytest.mark.parametrize(
    "how, cause", [("tuple", "ProtocolError: rank 0 sent a tuple"), ("bad-error", "AttributeError")]
)
def test_a_malformed_message_fails_the_pool_and_every_pending_job(how, cause):
    with WorkerPool(
        "cpu:2", TWO, threads_per_worker=1, worker_setup=(protocol_jobs.send_malformed_on_request, ())
    ) as pool:
        pids, prefix = pool.pids, pool.shm_prefix
        first = pool.submit(protocol_jobs.emit_malformed_then_sleep, how, 30.0)
        queued = pool.submit(echo, "behind it")
        t0 = time.monotonic()
        for fut in (first, queued):
            with pytest.raises(MonitorFailed) as info:
                fut.result(timeout=60)
            msg = str(info.value)
            assert "--- host traceback ---" in msg and "Traceback (most recent call last)" in msg and cause in msg
        assert time.monotonic() - t0 < PROMPT_S  # not the job's 30 s, nor a timeout
        assert isinstance(pool.last_failure, MonitorFailed)
        assert_gone(pids, prefix)
        assert pool.submit(echo, 41).result(timeout=60) == 41  # a fresh pool
        assert pool.starts == 2


def test_an_error_in_the_monitor_thread_fails_the_pool_and_every_pending_job():
    with WorkerPool("cpu:2", TWO, threads_per_worker=1) as pool:
        fut = pool.submit(protocol_jobs.emit_malformed_then_sleep, "none", 30.0)

        def broken_check(jobs):
            raise RuntimeError("a bug in the watchdog")

        pool._runtime.watch.check = broken_check
        with pytest.raises(MonitorFailed, match="a bug in the watchdog") as info:
            fut.result(timeout=60)
        assert "while watching the workers" in str(info.value) and "broken_check" in str(info.value)
        assert pool.submit(echo, 7).result(timeout=60) == 7 and pool.starts == 2
