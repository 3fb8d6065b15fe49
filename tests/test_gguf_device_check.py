"""The GPU check's GGUF step (dit_devtools/gguf_device_check.py, run by dit_devtools/gpu_check.sh) on the CPU: Q8_0
and Q4_K files keep their GGML blocks where the model is loaded, dequantise there as on the CPU, and the step is
timed against the bf16 file; the shell script that runs it parses and brings the ``gguf`` wheel along."""

from __future__ import annotations

import json
import re
import subprocess
from importlib import metadata
from pathlib import Path

from dit_devtools.gguf_device_check import main

SCRIPT = Path(__file__).resolve().parents[1] / "dit_devtools" / "gpu_check.sh"


def test_the_gguf_device_check_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gguf_device.json"
    assert main(["--device", "cpu", "--quick", "--json", str(out)]) == 0
    results = json.loads(out.read_text(encoding="utf-8"))
    assert results["ok"] and set(results["step_seconds"]) == {"bf16", "Q8_0", "Q4_K"}
    for quant, f in results["files"].items():
        assert f["kinds"] == [quant] and f["quantised_layers"] >= 19 and f["blocks_on_device"], f
        assert f["dequant_max_rel_diff_vs_cpu"] == 0 and f["forward_rel_error_vs_cpu_fp32"] == 0
    # GGML bytes held, not a dequantised copy: Q4_K (4.5 bits) under Q8_0 (8.5 bits), both under float32's 32
    q8, q4 = results["files"]["Q8_0"]["held_bytes"], results["files"]["Q4_K"]["held_bytes"]
    assert q4 < 0.75 * q8


def test_gpu_check_parses_and_carries_the_gguf_wheel():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text(encoding="utf-8")
    wanted = re.search(r"WANTED=\((.*?)\)", text, re.S).group(1).split()
    assert f"gguf=={metadata.version('gguf')}" in wanted and f"pyyaml=={metadata.version('pyyaml')}" in wanted
    assert "-m dit_devtools.gguf_device_check" in text
