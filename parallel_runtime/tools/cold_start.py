"""The first picture's wait: how long the README's first command (``generate --model tiny-flux-shapes`` on
``cpu:2``) takes to load, and where that time goes, each measured in fresh processes (nothing warm).

``cold_load`` runs the command itself and times it from its start to its ``loaded`` line (what a user
waits for), and runs this module (``python -m parallel_runtime.tools.cold_start``), which repeats the
command's steps with a clock between them: the host's imports, its checks of the request and the model
files, the workers' start (process, ``import torch``, gloo's rendezvous) up to READY, and the load job
(diffusers, the model, its text encoders); with each process's CPU seconds, since on a busy machine the
wall times stretch with the load average (recorded too).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "tiny-flux-shapes"
DEVICES = "cpu:2"


README_COMMAND = ("-m", "parallel_runtime", "generate", "--model", MODEL, "--devices", DEVICES)


def cli_load_seconds(timeout: float = 600.0) -> float:
    """Seconds from starting the README's command (one step) to its ``loaded`` line."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out.png"
        command = [sys.executable, *README_COMMAND, "--steps", "1", "--out", str(out)]
        t0 = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each line as it is printed, not when a buffer fills
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        loaded = None
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("loaded ") and loaded is None:
                loaded = time.perf_counter() - t0
        _, err = proc.communicate(timeout=timeout)
        if proc.returncode != 0 or loaded is None:
            raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {err[-2000:]}")
        return loaded


def phases(timeout: float = 600.0) -> dict[str, Any]:
    """The load's steps, timed in a fresh process (see the module's docstring)."""
    proc = subprocess.run(
        [sys.executable, "-m", __name__], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the cold-start probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cold_load(runs: int = 3) -> dict[str, Any]:
    """``cold_load_s`` (the median of ``runs`` starts of the README command) and one probe's phases."""
    load_before = os.getloadavg()[0]
    seconds = [cli_load_seconds() for _ in range(runs)]
    probe = phases()
    return {
        "cold_load_s": statistics.median(seconds),
        "cold_load_runs_s": seconds,
        "cold_load_phases": probe,
        "cold_load_load_average_1m": [load_before, os.getloadavg()[0]],
    }


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    t0 = time.perf_counter()
    walls: dict[str, float] = {}
    cpu: dict[str, Any] = {}

    def mark(name: str, since: float) -> float:
        now = time.perf_counter()
        walls[name] = now - since
        return now

    from ..runtime.pools import PoolRegistry
    from ..service import api
    from ..service.api import LoadRequest, check_sample_request, load_parallel_model
    from .measure import cpu_seconds

    t = mark("host_imports_s", t0)
    cpu["host_after_imports"] = _cpu_self()
    request = LoadRequest(MODEL, DEVICES, None, "fp32", "auto")
    check_sample_request(
        request, 256, 256, batch_size=1, seed=0, steps=8, cfg=1.0, denoise=1.0, guidance=3.5, sampler="euler",
        scheduler="simple",
    )  # fmt: skip
    t = mark("host_checks_s", t)
    heavy = [m for m in ("diffusers", "transformers") if m in sys.modules]  # the workers' imports, not the host's
    registry = PoolRegistry()
    load_into = api._load_into
    ready: list[float] = []

    def timed_load_into(pool, *args, **kwargs):  # called once the workers said READY
        ready.append(time.perf_counter())
        cpu["workers_at_ready"] = [round(cpu_seconds(p), 3) for p in pool.pids]
        return load_into(pool, *args, **kwargs)

    api._load_into = timed_load_into
    try:
        model = load_parallel_model(request, registry)
        done = time.perf_counter()
        walls["workers_ready_s"] = ready[0] - t
        walls["load_job_s"] = done - ready[0]
        cpu["workers_after_load"] = [round(cpu_seconds(p), 3) for p in model.pool.pids]
        cpu["host_after_load"] = _cpu_self()
        walls["total_s"] = done - t0
        t = time.perf_counter()
        model.encode_text("a green square on a yellow background")
        walls["first_text_encode_s"] = time.perf_counter() - t
    finally:
        api._load_into = load_into
        registry.close_all()
    report = {"wall_s": walls, "cpu_s": cpu, "host_imported_before_load": heavy, "load_average_1m": os.getloadavg()[0]}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
