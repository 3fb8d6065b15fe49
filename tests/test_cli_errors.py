"""The CLI on bad input and failures: checked before any worker starts, one clear message (no
double traceback), Ctrl-C cancels the job and exits 130 at once."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time

import pytest

from dit_devtools.tiny import ensure_tiny_model
from tests.leftovers import assert_gone


def _generate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parallel_runtime", "generate", "--devices", "cpu:2", "--steps", "2", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--width", "0"], "width=0 is out of range"),
        (["--pp", "2", "--width", "72"], "not a multiple of 16 px, and the layout uses PipeFusion"),
        (["--sampler", "bogus"], "unknown sampler 'bogus'"),
        (["--steps", "0"], "steps=0 is out of range"),
        (["--seed", "-5"], "seed=-5 is out of range"),
        (["--attention", "bogus"], "unknown attention backend 'bogus'"),
        (["--cfg-scale", "nan"], "cfg is nan"),
    ],
)
def test_bad_arguments_fail_before_any_worker_starts(tmp_path, args, needle):
    proc = _generate(*args, "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and "fix:" in proc.stderr
    assert "loaded" not in proc.stdout and "Traceback" not in proc.stderr


def test_a_worker_side_error_is_one_message_not_two_tracebacks(tmp_path):
    broken = tmp_path / "broken-flux"
    shutil.copytree(ensure_tiny_model("tiny-flux"), broken)
    (broken / "vae" / "config.json").write_text("{ not json")
    proc = _generate("--model", str(broken), "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "error: " in proc.stderr and "failed on rank" in proc.stderr and "is not a valid JSON file" in proc.stderr
    assert "Traceback" not in proc.stderr  # the remote traceback only with --debug
    debug = _generate("--model", str(broken), "--debug", "--out", str(tmp_path / "x.png"))
    assert "remote traceback" in debug.stderr


def test_ctrl_c_cancels_and_exits_130_at_once(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "parallel_runtime", "generate", "--devices", "cpu:2", "--steps", "10000"]
        + ["--out", str(tmp_path / "x.png")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = ""
    while "step 2/" not in seen:
        char = proc.stdout.read(1)
        assert char, proc.stderr.read()[-2000:]
        seen += char
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert time.monotonic() - t0 < 3.0
    assert "interrupted" in err and "Traceback" not in err
    assert_gone([], f"dpar-{proc.pid}-", within=3.0)  # workers, segments, private folder of its pool


@pytest.mark.parametrize(
    "out, needle",
    [
        ("no_such_dir/out.png", "no_such_dir does not exist"),
        (".", "is a folder"),
        ("a_file/out.png", "a_file is a file, not a folder"),
        ("out.notapicture", "'.notapicture' is not a picture format"),
    ],
)
def test_output_paths_are_checked_before_any_worker_starts(tmp_path, out, needle):
    """A missing output folder used to lose the whole job to a FileNotFoundError at its end."""
    (tmp_path / "a_file").write_text("")
    proc = _generate("--out", str(tmp_path / out))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert "loaded" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["runtime", "--json", "{tmp}"], "is a folder"),
        (["runtime", "--json", "{tmp}/a_file/results.json"], "a_file is a file, not a folder"),
        (["pipefusion", "--quick", "--model", "{tmp}/no-such-model"], "no such file or folder"),
    ],
)
def test_bench_path_arguments_are_checked_before_the_bench_runs(tmp_path, args, needle):
    (tmp_path / "a_file").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_runtime", "bench", *argv], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 60  # refused at once, not after the bench
