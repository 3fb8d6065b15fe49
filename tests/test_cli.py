"""The README's main-job command path: doctor and generate on CPU ranks with the embedded model."""

from __future__ import annotations

import json
import subprocess
import sys

from PIL import Image


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "parallel_runtime", *args], capture_output=True, text=True, timeout=timeout
    )


def test_doctor_reports_devices_and_backends():
    proc = _run("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["gloo_available"] is True
    assert any(d["device"] == "cpu" and d["total_bytes"] > 0 for d in info["devices"])
    assert "shm_free_bytes" in info
    text = _run("doctor").stdout
    assert "gloo: yes" in text and "devices:" in text


def test_generate_writes_png_of_requested_size(tmp_path):
    out = tmp_path / "fox.png"
    proc = _run(
        "generate",
        "--model",
        "tiny-flux",
        "--devices",
        "cpu:2",
        "--ulysses",
        "2",
        "--steps",
        "2",
        "--width",
        "128",
        "--height",
        "96",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 2/2" in proc.stdout
    with Image.open(out) as img:
        assert img.size == (128, 96) and img.mode == "RGB"


def test_generate_bad_layout_is_a_clear_error_before_start(tmp_path):
    proc = _run("generate", "--devices", "cpu:2", "--ulysses", "4", "--out", str(tmp_path / "x.png"))
    assert proc.returncode == 2
    assert "needs 4 ranks but 2 device" in proc.stderr and "fix:" in proc.stderr


def test_generate_warns_of_a_rounded_size_first_and_logs_one_progress_line_per_step(tmp_path):
    """Not a terminal (a pipe, a log): one line per step, as far as the slowest rank, never one per rank's
    report; a size the VAE cannot make is rounded with a warning before the load, not only in the size."""
    out = tmp_path / "shapes.png"
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_runtime", "generate", "--devices", "cpu:2", "--steps", "3"]
        + ["--width", "100", "--height", "64", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    lines = proc.stdout.splitlines()  # (splitlines also splits at a carriage return)
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning: "))
    assert "the picture will be 96x64 px, not 100x64: width 100 px -> 96 px" in lines[warning]
    assert warning < next(i for i, line in enumerate(lines) if line.startswith("loaded "))
    steps = [line for line in lines if " step " in line]
    assert [s.split("  ")[0] for s in steps] == ["sampling step 1/3", "sampling step 2/3", "sampling step 3/3"]
    assert "\r" not in proc.stdout and "steps/s" in steps[0] and "ETA" in steps[0] and "took" in steps[-1]
    with Image.open(out) as img:
        assert img.size == (96, 64)
