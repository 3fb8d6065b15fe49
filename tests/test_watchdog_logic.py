"""The watchdog's judgement over pulse readings (pure logic; the real processes are in test_faults)."""

from __future__ import annotations

import sys
import threading

from parallel_runtime.runtime.control import COMPUTING, IDLE, NO_JOB, WAITING, Pulse
from parallel_runtime.runtime.watchdog import Watchdog, WatchdogSettings, classify_frame

S = 1_000_000_000
SETTINGS = WatchdogSettings(stopped_s=1.0, heartbeat_s=10.0, stall_factor=20.0, stall_min_s=2.0, stall_first_s=5.0)


def pulse(rank, state, since_s, progress=1, progress_s=0.0, beat_s=100.0, job=1):
    return Pulse(rank, job, progress, int(progress_s * S), int(beat_s * S), state, int(since_s * S))


def test_a_stopped_rank_is_named_after_stopped_s():
    dog = Watchdog(SETTINGS, 2)
    pulses = [pulse(0, WAITING, 99), pulse(1, COMPUTING, 99)]
    assert dog.check(100 * S, pulses, ["S", "T"], {0, 1}) is None  # just seen stopped
    verdict = dog.check(int(101.2 * S), pulses, ["S", "T"], {0, 1})
    assert verdict.rank == 1 and verdict.kind == "stopped" and "rank 1 is stopped" in verdict.describe()
    dog.check(int(101.3 * S), pulses, ["S", "S"], {0, 1})  # continued (SIGCONT): forgotten
    assert dog.check(int(101.4 * S), pulses, ["S", "T"], {0, 1}) is None


def test_a_silent_heartbeat_is_a_frozen_rank():
    dog = Watchdog(SETTINGS, 2)
    pulses = [pulse(0, IDLE, 0, beat_s=100.0, job=NO_JOB), pulse(1, IDLE, 0, beat_s=80.0, job=NO_JOB)]
    verdict = dog.check(100 * S, pulses, ["S", "S"], set())
    assert verdict.rank == 1 and verdict.kind == "frozen"


def test_the_computing_rank_is_blamed_never_the_waiting_one():
    dog = Watchdog(SETTINGS, 2)
    # rank 0 computes with no progress since t=90; rank 1 waits in a collective since t=91
    pulses = [pulse(0, COMPUTING, 80, progress_s=90), pulse(1, WAITING, 91, progress_s=91)]
    verdict = dog.check(100 * S, pulses, ["R", "S"], {0, 1})
    assert verdict.rank == 0 and verdict.kind == "stalled" and verdict.waiting_ranks == (1,)
    assert "rank 0 made no progress" in verdict.describe()
    # the same picture within the bound (first job, nothing measured: stall_first_s = 5 s) is fine
    assert Watchdog(SETTINGS, 2).check(94 * S, pulses, ["R", "S"], {0, 1}) is None


def test_stall_bound_scales_with_the_measured_step_time():
    dog = Watchdog(SETTINGS, 2)
    for t in range(10):  # both ranks make a progress point every 0.5 s
        dog.check(
            int((10 + 0.5 * t) * S), [pulse(r, COMPUTING, 0, t + 1, 10 + 0.5 * t) for r in (0, 1)], ["R"] * 2, {0, 1}
        )
    assert abs(dog.interval_s - 0.5) < 1e-6
    assert SETTINGS.stall_bound(dog.interval_s) == 10.0  # 20 x 0.5 s
    stuck = [pulse(0, COMPUTING, 0, 10, 14.5), pulse(1, WAITING, 15, 11, 15)]
    assert dog.check(int(24 * S), stuck, ["R", "S"], {0, 1}) is None  # 9 s < 10 s
    assert dog.check(int(26 * S), stuck, ["R", "S"], {0, 1}).rank == 0


def test_every_rank_waiting_is_a_lost_link():
    dog = Watchdog(SETTINGS, 2)
    pulses = [pulse(0, WAITING, 90), pulse(1, WAITING, 92)]
    verdict = dog.check(100 * S, pulses, ["S", "S"], {0, 1})
    assert verdict.rank is None and verdict.kind == "no-arrival" and "every rank" in verdict.describe()


def test_frame_classification_of_a_thread_waiting_in_torch_distributed():
    import torch.distributed.distributed_c10d as c10d

    entered, release = threading.Event(), threading.Event()
    code = compile("def wait_here(entered, release):\n    entered.set()\n    release.wait()\n", "c10d", "exec")
    namespace = {"__name__": c10d.__name__}
    exec(code, namespace)  # a function whose frame reports torch.distributed's module name
    thread = threading.Thread(target=namespace["wait_here"], args=(entered, release))
    thread.start()
    entered.wait(5)
    try:
        frame = sys._current_frames()[thread.ident]
        while frame.f_globals.get("__name__") == "threading":  # Event.wait's own frames
            frame = frame.f_back
        assert classify_frame(frame) == WAITING
        assert classify_frame(sys._getframe()) == COMPUTING
    finally:
        release.set()
        thread.join()
