"""``python -m parallel_runtime bench soak``: many small jobs on warm pools, then the fault matrix.

1,000 jobs (``--quick``: 100) on one tiny-flux ParallelModel (2 CPU ranks, Ulysses): varied seeds,
sizes, batch sizes, samplers and steps, with and without CFG, text encodes and VAE decodes; plus a
few on CFG-parallel (cfg=2) and PipeFusion (pp=2) pools. Every ``sample_every`` jobs it records the
host's and the workers' resident memory, open file descriptors and threads, and the /dev/shm
entries and bytes of this process's pools. Reported: least-squares slopes per 1,000 jobs over the
second half of the samples (the first half includes warm-up: caches, allocator pools), p50/p99
latency per job kind, and the fault matrix (every cell's outcome and detection time; ``--quick``:
the test suite's subset). The model and the matrix come from the checkout's ``dit_devtools``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..checkout import devtools_module
from ..parallel.config import ParallelConfig
from ..runtime.pools import PoolRegistry
from ..service.api import LoadRequest, ParallelModel, load_parallel_model

SAMPLERS = ("euler", "euler_ancestral", "dpmpp_2m", "heun")
SIZES = (32, 48, 64)
SIDE_LAYOUTS = {"cfg=2": ParallelConfig(cfg=2), "pp=2": ParallelConfig(pp=2)}
SIDE_SHARE = 0.05  # of the jobs, each side layout gets this share
RESOURCES = ("rss_mib", "fds", "threads", "shm_entries", "shm_mib")


def _status(pid: int) -> dict[str, int]:
    fields = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                fields[key] = int(value.split()[0])
        fields["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return fields


def resource_sample(worker_pids: list[int]) -> dict[str, dict[str, float]]:
    """Host and workers (summed): resident MiB, fds, threads; this host's /dev/shm entries and MiB."""
    out: dict[str, dict[str, float]] = {}
    for who, pids in (("host", [os.getpid()]), ("workers", worker_pids)):
        stats = [_status(p) for p in pids]
        out[who] = {
            "rss_mib": sum(s.get("VmRSS", 0) for s in stats) / 1024,
            "fds": sum(s.get("fds", 0) for s in stats),
            "threads": sum(s.get("Threads", 0) for s in stats),
        }
    entries = list(Path("/dev/shm").glob(f"dpar-{os.getpid()}-*"))  # a pool's folder (its segments inside)
    sizes = []
    for e in entries:
        try:
            sizes += [f.stat().st_size for f in e.iterdir()] if e.is_dir() else [e.stat().st_size]
        except OSError:
            continue
    out["shm"] = {"shm_entries": len(sizes), "shm_mib": sum(sizes) / 2**20}
    return out


def slope_per_1000(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs (jobs), times 1,000; None with fewer than two points."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if den == 0:
        return None
    return 1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))]


@dataclasses.dataclass
class SoakJob:
    kind: str
    layout: str
    run: Callable[[], Any]


class Soak:
    """The models (one per layout, each in its own registry) and the job generator."""

    def __init__(self, model: str, seed: int):
        self.model_name = model
        self.rng = random.Random(seed)
        self.registry = PoolRegistry(max_pools=3)
        self.models: dict[str, ParallelModel] = {}
        self.positive = self.negative = None

    def model(self, layout: str) -> ParallelModel:
        if layout not in self.models:
            config = SIDE_LAYOUTS.get(layout, ParallelConfig(ulysses=2))
            request = LoadRequest(self.model_name, "cpu:2", config, threads_per_worker=1)
            self.models[layout] = load_parallel_model(request, self.registry)
        return self.models[layout]

    def prompts(self):
        if self.positive is None:
            self.positive = self.model("usp").encode_text("a lighthouse at dusk")
            self.negative = self.model("usp").encode_text("blurry")
        return self.positive, self.negative

    def next_job(self) -> SoakJob:
        r = self.rng
        roll = r.random()
        for i, layout in enumerate(SIDE_LAYOUTS):
            if roll < SIDE_SHARE * (i + 1):
                return self._sample(layout, cfg=2.0 if layout == "cfg=2" else 1.0)
        roll = r.random()
        if roll < 0.1:
            words = r.choice(["a red fox", "two boats on a lake", "", "a city at night, rain"])
            return SoakJob("encode", "usp", lambda: self.model("usp").encode_text(words))
        if roll < 0.2:
            size = r.choice(SIZES)
            latent = self._latent(size)
            return SoakJob("decode", "usp", lambda: self.model("usp").decode(latent))
        return self._sample("usp", cfg=r.choice([1.0, 1.0, 3.5]))

    def _latent(self, size: int):
        import torch

        g = torch.Generator().manual_seed(self.rng.randrange(2**31))
        m = self.model("usp")
        f = m.spatial_factor
        return torch.randn(1, m.latent_channels, size // f, size // f, generator=g)

    def _sample(self, layout: str, cfg: float) -> SoakJob:
        r = self.rng
        positive, negative = self.prompts()
        kwargs = {
            "width": r.choice(SIZES),
            "height": r.choice(SIZES),
            "batch_size": r.choice([1, 1, 2]),
            "seed": r.randrange(2**32),
            "steps": r.choice([1, 2]),
            "cfg": cfg,
            "sampler_name": r.choice(SAMPLERS),
        }
        neg = negative if cfg != 1.0 else None
        kind = f"sample {layout}" + (" cfg" if cfg != 1.0 and layout == "usp" else "")
        return SoakJob(kind, layout, lambda: self.model(layout).sample(positive, neg, None, **kwargs))

    def worker_pids(self) -> list[int]:
        return [pid for m in self.models.values() for pid in m.pool.pids]

    def close(self) -> None:
        self.registry.close_all()


def soak(jobs: int, sample_every: int, model: str = "tiny-flux", seed: int = 0) -> dict[str, Any]:
    """Run ``jobs`` jobs; resources every ``sample_every`` jobs; slopes and latencies."""
    s = Soak(model, seed)
    try:
        for layout in ("usp", *SIDE_LAYOUTS):
            s.model(layout)  # every pool warm before the first sample: its start is not a leak
        s.prompts()
        latencies: dict[str, list[float]] = {}
        samples: list[dict[str, Any]] = []
        starts_before = {k: m.pool.starts for k, m in s.models.items()}
        t_all = time.monotonic()
        for i in range(1, jobs + 1):
            job = s.next_job()
            t0 = time.perf_counter()
            job.run()
            latencies.setdefault(job.kind, []).append(time.perf_counter() - t0)
            if i % sample_every == 0 or i == jobs:
                samples.append({"jobs": i, **resource_sample(s.worker_pids())})
        info = s.models["usp"].info
        restarts = {k: m.pool.starts - starts_before[k] for k, m in s.models.items()}
        wall = time.monotonic() - t_all
    finally:
        s.close()
    half = samples[len(samples) // 2 :]
    slopes: dict[str, dict[str, float | None]] = {}
    for who in ("host", "workers", "shm"):
        keys = [k for k in RESOURCES if k in half[0][who]] if half else []
        slopes[who] = {k: slope_per_1000([h["jobs"] for h in half], [h[who][k] for h in half]) for k in keys}
    return {
        "model": (
            f"{model} (random weights): {info['family']}, {info['num_blocks']} blocks, {info['num_heads']} heads, "
            f"{info['latent_channels']} latent channels; {'/'.join(map(str, SIZES))} px, 1-2 steps, batch 1-2, "
            f"samplers {', '.join(SAMPLERS)}; 2 CPU ranks x 1 thread: Ulysses (most jobs), cfg=2 and pp=2 "
            f"({SIDE_SHARE:.0%} each)"
        ),
        "baseline": "none: slopes are per 1,000 jobs (least squares over the second half of the samples), "
        "latencies are per job",
        "jobs": jobs,
        "wall_s": round(wall, 1),
        "pool_restarts": restarts,
        "sample_every_jobs": sample_every,
        "slopes_per_1000_jobs": slopes,
        "first_sample": samples[0] if samples else None,
        "last_sample": samples[-1] if samples else None,
        "samples": samples,
        "latency_s": {
            kind: {"n": len(v), "p50": percentile(v, 0.5), "p99": percentile(v, 0.99)}
            for kind, v in sorted(latencies.items())
        },
    }


def run(quick: bool = False, matrix: bool = True) -> dict[str, Any]:
    if matrix:  # the fault matrix lives in the checkout (dit_devtools/faults): missing, fail before the jobs
        faults = devtools_module("faults.matrix", "bench soak's fault matrix")
        shm_cells = devtools_module("faults.shm_cells", "bench soak's fault matrix")
    result = soak(100 if quick else 1000, 10 if quick else 50)
    if matrix:
        Cell = faults.Cell
        cells = faults.QUICK_CELLS if quick else faults.all_cells()
        t0 = time.monotonic()
        outcomes = faults.run_matrix(cells)
        shm = [Cell("decode", "shm-full", 1), Cell("denoise-usp", "shm-full", 0)] if quick else shm_cells.shm_cells()
        outcomes += shm_cells.run_shm_cells(shm)
        result["fault_matrix"] = {
            "what": "cell = phase.fault.rank; detection_s = from the fault firing to the error reaching the "
            "caller; each passed cell also ran the next job on the same model (same result) and left nothing; "
            "shm-full cells (in a private mount namespace, 64 MiB /dev/shm, 256x256 px) pass when the job "
            "works and gives the same result",
            "cells": "quick subset" if quick else "all",
            "wall_s": round(time.monotonic() - t0, 1),
            "summary": faults.summary(outcomes),
            "outcomes": {
                r.cell: {
                    "outcome": r.outcome,
                    "detection_s": r.detection_s,
                    "error": r.error,
                    "problems": r.problems,
                    **({"note": r.note} if r.note else {}),
                }
                for r in outcomes
            },
        }
    return result
