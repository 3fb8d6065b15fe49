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
