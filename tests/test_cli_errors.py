"""The CLI on bad input and failures: checked before any worker starts, one clear message (no
double traceback), Ctrl-C cancels the job and exits 130 at once.

The refused commands run in one process (``cli_batch``: each as ``python -m parallel_runtime`` runs it, through
``parallel_runtime/__main__.py``, its own stdout, stderr and exit code; one cold import of torch for all of them);
tests/test_cli.py runs a refused command in a process of its own."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dit_devtools.tiny import ensure_tiny_model
from tests.leftovers import assert_gone

GENERATE = ["generate", "--devices", "cpu:2", "--steps", "2"]
# Runs each argv as `python -m parallel_runtime <argv>` would (sys.exit(main()) in __main__.py), capturing its own
# stdout/stderr; an exception the CLI lets out is written as the interpreter writes it (a Traceback, exit 1).
BATCH_RUNNER = """
import contextlib, io, json, runpy, sys, time, traceback
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["parallel_runtime", *argv]
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("parallel_runtime", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                    "seconds": time.monotonic() - t0})
print(json.dumps(results))
"""


def _generate(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parallel_runtime", *GENERATE, *args], capture_output=True, text=True, timeout=timeout
    )


BAD_ARGUMENTS = [
    (["--width", "0"], "width=0 is out of range"),
    (["--pp", "2", "--width", "72"], "not a multiple of 16 px, and the layout uses PipeFusion"),
    (["--sampler", "bogus"], "unknown sampler 'bogus'"),
    (["--steps", "0"], "steps=0 is out of range"),
    (["--seed", "-5"], "seed=-5 is out of range"),
    (["--attention", "bogus"], "unknown attention backend 'bogus'"),
    (["--cfg-scale", "nan"], "cfg is nan"),
]
BAD_OUTPUTS = [
    ("no_such_dir/out.png", "no_such_dir does not exist"),
    (".", "is a folder"),
    ("a_file/out.png", "a_file is a file, not a folder"),
    ("out.notapicture", "'.notapicture' is not a picture format"),
]
BAD_BENCH_PATHS = [
    (["runtime", "--json", "{tmp}"], "is a folder"),
    (["runtime", "--json", "{tmp}/a_file/results.json"], "a_file is a file, not a folder"),
    (["pipefusion", "--quick", "--model", "{tmp}/no-such-model"], "no such file or folder"),
]


@pytest.fixture(scope="module")
def cli_batch(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """case id -> (its own folder, holding an empty ``a_file``; the refused command's returncode/stdout/stderr/seconds)."""
    cases: dict[str, tuple[Path, list[str]]] = {}

    def folder(case: str) -> Path:
        path = tmp_path_factory.mktemp(case.replace("/", "_"))
        (path / "a_file").write_text("")
        return path

    for i, (args, _) in enumerate(BAD_ARGUMENTS):
        tmp = folder(f"args{i}")
        cases[f"args{i}"] = (tmp, [*GENERATE, *args, "--out", str(tmp / "x.png")])
    for i, (out, _) in enumerate(BAD_OUTPUTS):
        tmp = folder(f"out{i}")
        cases[f"out{i}"] = (tmp, [*GENERATE, "--out", str(tmp / out)])
    for i, (args, _) in enumerate(BAD_BENCH_PATHS):
        tmp = folder(f"bench{i}")
        cases[f"bench{i}"] = (tmp, ["bench", *(a.replace("{tmp}", str(tmp)) for a in args)])
    argvs = [argv for _, argv in cases.values()]
    proc = subprocess.run(
        [sys.executable, "-c", BATCH_RUNNER, json.dumps(argvs)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {case: (tmp, result) for (case, (tmp, _)), result in zip(cases.items(), results, strict=True)}


@pytest.mark.parametrize("case", range(len(BAD_ARGUMENTS)), ids=[needle for _, needle in BAD_ARGUMENTS])
def test_bad_arguments_fail_before_any_worker_starts(cli_batch, case):
    needle = BAD_ARGUMENTS[case][1]
    _, proc = cli_batch[f"args{case}"]
    assert proc["returncode"] == 2, proc["stderr"][-2000:]
    assert needle in proc["stderr"] and "fix:" in proc["stderr"]
    assert "loaded" not in proc["stdout"] and "Traceback" not in proc["stderr"]


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


@pytest.mark.parametrize("case", range(len(BAD_OUTPUTS)), ids=[needle for _, needle in BAD_OUTPUTS])
def test_output_paths_are_checked_before_any_worker_starts(cli_batch, case):
    """A missing output folder used to lose the whole job to a FileNotFoundError at its end."""
    needle = BAD_OUTPUTS[case][1]
    tmp, proc = cli_batch[f"out{case}"]
    assert proc["returncode"] == 2, proc["stderr"][-2000:]
    assert needle in proc["stderr"] and "fix:" in proc["stderr"] and "Traceback" not in proc["stderr"]
    assert "loaded" not in proc["stdout"]
    assert sorted(p.name for p in tmp.iterdir()) == ["a_file"]


@pytest.mark.parametrize("case", range(len(BAD_BENCH_PATHS)), ids=[needle for _, needle in BAD_BENCH_PATHS])
def test_bench_path_arguments_are_checked_before_the_bench_runs(cli_batch, case):
    needle = BAD_BENCH_PATHS[case][1]
    _, proc = cli_batch[f"bench{case}"]
    assert proc["returncode"] == 2, proc["stderr"][-2000:]
    assert needle in proc["stderr"] and "fix:" in proc["stderr"] and "Traceback" not in proc["stderr"]
    assert proc["seconds"] < 60  # refused at once, not after the bench
