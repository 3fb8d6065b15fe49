"""The lowest declared torch (and diffusers) really run the parallel paths: a smoke job that builds a
venv with exactly those floors (the other requirements as pip resolves them; cached under
~/.cache/dit-parallel) and runs the parallel-equals-single-device tests of tiny Flux there (Ulysses,
Ring, CFG, hybrid; PipeFusion, whose point-to-point sends use torch 2.6's group_peer) on CPU with gloo."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from pack_import import ROOT
from venv_cache import cache_root, cached_venv, key_of

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI's)
FLOORED = ("torch", "diffusers")
SMOKE_TESTS = (
    "tests/test_parallel_generate.py::test_parallel_equals_single_device",
    "tests/test_pipefusion.py::test_layout_equals_single_device_after_full_warmup_and_stays_close_with_stale_kv[pp2-tiny-flux]",
)


def declared_floors() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    floors = {}
    for dep in deps:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)(,.*)?", dep.replace(" ", ""))
        if match and match.group(1).lower() in FLOORED:
            floors[match.group(1).lower()] = match.group(2)
    assert set(floors) == set(FLOORED), f"pyproject.toml must declare a floor (>=) for {FLOORED}: {deps}"
    return floors


def _release(version: str) -> tuple[int, ...]:
    """(2, 6) for "2.6" and "2.6.0": trailing zeros do not make another release."""
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


@pytest.mark.timeout(3600)  # the first run downloads torch and its CUDA libraries (about 3 GB) into the venv
def test_the_lowest_declared_torch_runs_the_parallel_paths():
    floors = declared_floors()
    pins = [f"{name}=={version}" for name, version in sorted(floors.items())]
    requirements = (ROOT / "requirements.txt").read_text(encoding="utf-8")
    target = cache_root() / f"lowest-venv-{key_of(*pins, requirements)}"
    python = cached_venv(
        target, [pins, ["-r", str(ROOT / "requirements.txt"), *pins], ["pytest>=8", "pytest-timeout>=2.3"]]
    )
    versions = subprocess.run(
        [str(python), "-c", "import torch, diffusers; print(torch.__version__.split('+')[0], diffusers.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()
    assert [_release(v) for v in versions] == [_release(floors["torch"]), _release(floors["diffusers"])], versions
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's parallel_runtime, not an installed one
    proc = subprocess.run(
        [str(python), "-m", "pytest", *SMOKE_TESTS, "-k", "flux", "-q", "-p", "no:cacheprovider", "-x"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, f"torch {floors['torch']} smoke failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert re.search(r"\d+ passed", proc.stdout) and " failed" not in proc.stdout
