"""Runtime errors survive pickling (a process pool sends a child's exception back pickled): same type, same
message, same fields. Before, a ConfigError raised in a pool's child came back as a broken pool."""

from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from parallel_runtime import errors

CASES = [
    errors.ConfigError("what", "why", "fix"),
    errors.SharedMemoryFull("segment", "no room", "free /dev/shm"),
    errors.WorkerError("generate", 1, "ValueError", "bad", "Traceback ..."),
    errors.WorkerDied(0, -9, ["line a", "line b"], context="while sampling"),
    errors.WorkerHung(1, "the step", ["last line"]),
    errors.NonFiniteValues("step 3's output"),
    errors.ProtocolError("what", "why", "fix"),
    errors.VersionSkew(0, ("host", 1), ("worker", 2)),
    errors.MonitorFailed("the watchdog", "Traceback ..."),
]


@pytest.mark.parametrize("error", CASES, ids=[type(e).__name__ for e in CASES])
def test_round_trip_keeps_type_and_message(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert vars(back).keys() >= {k for k in vars(error) if k != "_made_with"}


def _refuse() -> None:
    raise errors.ConfigError("a refused file", "it is not a model", "pick another")


def test_a_pool_child_config_error_arrives_as_itself():
    with ProcessPoolExecutor(1) as pool, pytest.raises(errors.ConfigError, match="a refused file") as raised:
        pool.submit(_refuse).result(timeout=120)
    assert "pick another" in str(raised.value)
