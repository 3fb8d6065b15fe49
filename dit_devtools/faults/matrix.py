"""The fault matrix: each fault on each rank in each phase, on CPU with real worker processes.

A cell kills (SIGKILL), stops (SIGSTOP) or breaks (raise, NaN, an undecodable result, a worker of
other code than the host's: version skew) one rank in one phase, has another local user squat every
segment name it can see or guess (squat: the job must still work), or asks for a job too big for the
free memory (oversized: refused on the host, the pool untouched) — pool start, model load, denoising under USP (ulysses=2), CFG (cfg=2) and PipeFusion (pp=2),
VAE decode, text encode, idle — through :mod:`.injection`, and checks: the error has the
expected type and names the rank (NaN: the step), within ``BOUND_S`` of the fault firing; the host
is alive (it is the process running this); the next job on the same ParallelModel succeeds and
equals the healthy result for the same seed; nothing of a torn-down pool is left (worker
processes, /dev/shm segments, private folders). Cells that cannot happen are listed as not
applicable, with the reason. ``bench soak`` runs the whole matrix, the test suite a quick subset.
A full /dev/shm has its own cells (:mod:`.shm_cells`): they need a private mount namespace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from parallel_runtime.errors import ConfigError, VersionSkew, WorkerDied, WorkerError, WorkerHung
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.pools import PoolRegistry
from parallel_runtime.service.api import LoadRequest, ParallelModel, load_parallel_model

from .injection import FILLER, FaultPlan, disarm, fired_at, install, shm_is_private, squat_as_stranger, take_squats
from .stranger import remove_squats

LAYOUTS = {"usp": ParallelConfig(ulysses=2), "cfg": ParallelConfig(cfg=2), "pp": ParallelConfig(pp=2)}
PHASES = ("start", "load", "denoise-usp", "denoise-cfg", "denoise-pp", "decode", "encode", "idle")
FAULTS = ("kill", "stop", "raise", "nan", "undecodable", "skew", "squat", "oversized")  # shm-full: shm_cells.py
BOUND_S = 10.0  # the error must come this soon after the fault fired (a loaded 2-core machine)
# A load failing on one rank is raised once every rank has finished its part of the load (the ranks
# agree on failures after loading, so none waits in a collective forever): up to a whole load later.
LOAD_RAISE_BOUND_S = 60.0
SETTLE_S = 10.0  # a torn-down pool's processes and files must be gone this soon after the next job
POOL_OPTIONS = {"job_timeout_s": 120.0, "start_timeout_s": 180.0}  # a cell never hangs the run

NOT_APPLICABLE = {
    ("start", "nan"): "no model runs during pool start",
    ("start", "undecodable"): "pool start sends no job result",
    ("load", "nan"): "loading runs no model",
    ("idle", "raise"): "no job code runs while idle",
    ("idle", "nan"): "no model runs while idle",
    ("idle", "undecodable"): "no result is sent while idle",
    ("idle", "shm-full"): "nothing is written to /dev/shm while idle",
    ("load", "shm-full"): "its messages fit the ring slots reserved at pool start",
    ("encode", "shm-full"): "its messages fit the ring slots reserved at pool start",
}
NEEDS_NAMESPACE = "not applicable: needs a private mount namespace (a small tmpfs over /dev/shm: root, unshare -m)"
SHM_WARNING = ("/dev/shm", "--shm-size")  # a shm-full cell's job must work and warn with both
EXPECTED = {
    "kill": (WorkerDied, "SIGKILL"),
    "stop": (WorkerHung, "stopped"),
    "skew": (VersionSkew, "restart"),
    "oversized": (ConfigError, "GiB of activations per rank"),
}
STILL_WORKS = ("shm-full", "squat")  # faults the job must survive with the same result
OVERSIZED_SIDE = 16384  # ComfyUI's largest image side: a million tokens


@dataclasses.dataclass(frozen=True)
class Cell:
    phase: str
    fault: str
    rank: int

    @property
    def name(self) -> str:
        return f"{self.phase}.{self.fault}.rank{self.rank}"

    @property
    def layout(self) -> str:
        return self.phase.split("-", 1)[1] if self.phase.startswith("denoise-") else "usp"

    def not_applicable(self) -> str | None:
        if self.phase == "encode" and self.fault == "nan" and self.rank != 0:
            return "only rank 0 holds the text encoders"
        if self.fault == "skew" and self.phase != "start":
            return "a running worker's code does not change: skew shows when a worker starts"
        if self.fault == "oversized" and not self.phase.startswith("denoise-"):
            return "the host estimates the activation memory of sampling jobs (the denoise phases)"
        if self.fault == "oversized" and self.rank != 0:
            return "the host refuses the job before any rank gets it: one cell (rank 0) per phase"
        return NOT_APPLICABLE.get((self.phase, self.fault))


@dataclasses.dataclass
class CellResult:
    cell: str
    outcome: str  # "pass" | "fail" | "not applicable: <why>"
    error: str = ""  # type and first line of the error the faulted job raised
    detection_s: float | None = None  # from the fault firing to the error reaching the caller
    next_job: str = ""  # "same result" | what went wrong
    leftovers: dict[str, list] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    old_pids: list[int] = dataclasses.field(default_factory=list)
    old_prefix: str = ""
    note: str = ""  # shm-full cells: whether the fallback warning was given


def all_cells(world: int = 2) -> list[Cell]:
    return [Cell(p, f, r) for p in PHASES for f in FAULTS for r in range(world)]


QUICK_CELLS = (
    Cell("start", "kill", 1),
    Cell("load", "stop", 0),
    Cell("denoise-usp", "kill", 1),
    Cell("denoise-usp", "undecodable", 0),
    Cell("denoise-cfg", "nan", 1),
    Cell("denoise-pp", "raise", 0),
    Cell("decode", "undecodable", 1),
    Cell("encode", "nan", 0),
    Cell("encode", "raise", 1),
    Cell("idle", "stop", 1),
    Cell("start", "skew", 0),
    Cell("decode", "squat", 1),
    Cell("denoise-usp", "oversized", 0),
)
"""The subset the test suite runs: every fault kind and every phase at least once, both ranks."""


class _FaultRegistry(PoolRegistry):
    """A registry whose pools carry the injection hook (and bounded job/start waits)."""

    def __init__(self, plan_dir: str):
        super().__init__(max_pools=1)
        self.options = {"worker_setup": (install, (plan_dir,)), **POOL_OPTIONS}

    def get(self, devices, config, key=None, **pool_options):
        return super().get(devices, config, key, **{**pool_options, **self.options})


class Matrix:
    """One registry and tiny-flux model per layout (reused across cells), the plan folder shared."""

    def __init__(self, model: str = "tiny-flux", size: int = 64, steps: int = 2):
        self.plan_dir = tempfile.mkdtemp(prefix="dpar-fault-plan-")
        self.model, self.size, self.steps = model, size, steps
        self.registries: dict[str, _FaultRegistry] = {}
        self.models: dict[str, ParallelModel] = {}
        self.healthy: dict[str, Any] = {}  # phase -> the result before any fault (the oracle)

    # -- models and jobs ----------------------------------------------------------------------------
    def loaded(self, layout: str) -> ParallelModel:
        if layout not in self.models:
            registry = self.registries.setdefault(layout, _FaultRegistry(self.plan_dir))
            request = LoadRequest(self.model, "cpu:2", LAYOUTS[layout], threads_per_worker=1)
            self.models[layout] = load_parallel_model(request, registry)
        return self.models[layout]

    def _prompts(self):
        if "positive" not in self.healthy:
            model = self.loaded("usp")
            self.healthy["positive"] = model.encode_text("a lighthouse at dusk")
            self.healthy["negative"] = model.encode_text("")
        return self.healthy["positive"], self.healthy["negative"]

    def job(self, phase: str, layout: str, oversized: bool = False) -> Any:
        """Run the job of ``phase`` (start/load/idle: a sample, which restarts and reloads as needed);
        ``oversized``: the sample at ``OVERSIZED_SIDE`` px with a batch twice what the free memory holds."""
        model = self.loaded(layout)
        if phase == "decode":
            return model.decode(self._latent())
        if phase == "encode":
            return model.encode_text("a lighthouse at dusk").prompt_embeds
        positive, negative = self._prompts()
        cfg = 2.0 if layout == "cfg" else 1.0
        negative = negative if cfg != 1.0 else None
        if oversized:
            batch = _batch_beyond_memory(model, OVERSIZED_SIDE, cfg)
            return model.sample(positive, negative, None, OVERSIZED_SIDE, OVERSIZED_SIDE, batch_size=batch, cfg=cfg)
        return model.sample(positive, negative, None, self.size, self.size, steps=self.steps, cfg=cfg, seed=7)

    def _latent(self) -> torch.Tensor:
        if "latent" not in self.healthy:
            self.healthy["latent"] = self.job("denoise-usp", "usp")
        return self.healthy["latent"]

    def oracle(self, cell: Cell) -> Any:
        key = f"{cell.phase if cell.phase in ('decode', 'encode') else 'sample'}.{cell.layout}"
        if key not in self.healthy:
            self.healthy[key] = self.job(cell.phase, cell.layout)
        return self.healthy[key]

    # -- one cell -----------------------------------------------------------------------------------
    def run(self, cell: Cell) -> CellResult:
        why = cell.not_applicable()
        if why is not None:
            return CellResult(cell.name, f"not applicable: {why}")
        if cell.fault == "shm-full" and not shm_is_private():
            return CellResult(cell.name, NEEDS_NAMESPACE)
        result = CellResult(cell.name, "fail")
        expected = self.oracle(cell)  # healthy run first: a warm pool, and the oracle for the next job
        model = self.loaded(cell.layout)
        result.old_pids, result.old_prefix = list(model.pool.pids), model.pool.shm_prefix or ""
        before = self.host_files()
        FaultPlan(cell.name, cell.rank, cell.phase.split("-")[0], cell.fault).arm(self.plan_dir)
        if cell.phase in ("start", "load"):
            model.pool.abort("fault matrix: restart the workers so that the next job starts and loads them")
        with _captured_warnings() as warnings:
            error, raised_at, value = self._provoke(cell, model)
        fired = fired_at(self.plan_dir, cell.name)
        squats = take_squats(self.plan_dir, cell.name)
        disarm(self.plan_dir)
        FILLER.unlink(missing_ok=True)
        if error is not None:
            result.error = f"{type(error).__name__}: {_first_line(error)}"
        if fired is not None and raised_at is not None:
            result.detection_s = round(max(0.0, raised_at - fired), 3)
        if cell.fault in STILL_WORKS:
            result.problems += _judge_still_works(error, fired, value, expected, check_value=cell.phase != "idle")
        if cell.fault == "shm-full":
            warned = any(all(w in line for w in SHM_WARNING) for line in warnings)
            result.note = "warned: /dev/shm full, using the private folder" if warned else "no new segment was needed"
        elif cell.fault == "squat":
            result.note = f"another user squatted {len(squats)} names"
        else:
            result.problems += _judge(cell, error, fired, result.detection_s)
        try:
            again = self.job(cell.phase, cell.layout)
            result.next_job = "same result" if _same(again, expected) else "a different result"
        except Exception as exc:  # noqa: BLE001 - recorded as the cell's failure
            result.next_job = f"failed: {type(exc).__name__}: {_first_line(exc)}"
        if result.next_job != "same result":
            result.problems.append(f"the next job: {result.next_job}")
        remove_squats(squats)
        result.leftovers = self.wait_for_leftovers(before, result.old_pids, result.old_prefix)
        if any(result.leftovers.values()):
            result.problems.append(f"left behind: {result.leftovers}")
        result.outcome = "pass" if not result.problems else "fail"
        return result

    def _provoke(self, cell: Cell, model: ParallelModel) -> tuple[BaseException | None, float | None, Any]:
        """(the error, when it reached us, the job's value when there was no error)."""
        if cell.phase == "idle" and cell.fault == "squat":
            (Path(self.plan_dir) / f"fired-{cell.name}").write_text(repr(time.time()))
            squat_as_stranger(self.plan_dir, cell.name, os.getpid())
            return None, None, None
        if cell.phase == "idle":
            (Path(self.plan_dir) / f"fired-{cell.name}").write_text(repr(time.time()))
            os.kill(model.pool.pids[cell.rank], signal.SIGKILL if cell.fault == "kill" else signal.SIGSTOP)
            deadline = time.monotonic() + BOUND_S * 3
            while model.pool.is_alive and time.monotonic() < deadline:
                time.sleep(0.01)
            return (None, None, None) if model.pool.is_alive else (model.pool.last_failure, time.time(), None)
        if cell.fault == "oversized":
            (Path(self.plan_dir) / f"fired-{cell.name}").write_text(repr(time.time()))
        try:
            value = self.job(cell.phase, cell.layout, oversized=cell.fault == "oversized")
        except Exception as exc:  # noqa: BLE001 - the error under test
            return exc, time.time(), None
        return None, None, value

    def wait_for_leftovers(self, before: dict[str, set], old_pids: list[int], old_prefix: str) -> dict[str, list]:
        """What the cell left, once it had ``SETTLE_S`` to go: of what this host has now and did not
        have ``before``, what no live pool of the matrix owns; and the pre-fault pool's processes
        and files if that pool was replaced. (Other pools of this process, e.g. a test session's,
        are not counted.)"""
        deadline = time.monotonic() + SETTLE_S
        while True:
            pools = [m.pool for m in self.models.values() if m.pool.is_alive]
            live_pids = {pid for p in pools for pid in p.pids}
            live = tuple(p.shm_prefix for p in pools if p.shm_prefix)
            replaced = old_prefix not in live
            now = self.host_files()
            left = {}
            for kind, names in now.items():
                new = names - before[kind]
                if kind == "processes":
                    stray = (new - live_pids) | ({p for p in old_pids if p in names} if replaced else set())
                else:
                    stray = {n for n in new if not (live and n.startswith(live))}
                    stray |= {n for n in names if replaced and old_prefix and n.startswith(old_prefix)}
                left[kind] = sorted(stray)
            if not any(left.values()) or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    @staticmethod
    def host_files() -> dict[str, set]:
        """This process's worker processes, /dev/shm segments and private folders (any pool)."""
        mine = f"dpar-{os.getpid()}-"
        return {
            "processes": set(worker_children()),
            "segments": {e.name for e in Path("/dev/shm").glob(mine + "*")},
            "private_dirs": {e.name for e in Path(tempfile.gettempdir()).glob(mine + "*")},
        }

    def close(self) -> None:
        for registry in self.registries.values():
            registry.close_all()
        disarm(self.plan_dir)
        Path(self.plan_dir).rmdir()


def worker_children(parent: int | None = None) -> list[int]:
    """Live worker processes (``parallel_runtime.runtime.worker``) whose parent is ``parent``."""
    parent = os.getpid() if parent is None else parent
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
            if int(fields[1]) != parent or fields[0] == "Z":
                continue
            if b"parallel_runtime.runtime.worker" in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _judge(cell: Cell, error: BaseException | None, fired: float | None, seconds: float | None) -> list[str]:
    if fired is None:
        return ["the fault never fired"]
    if error is None:
        return ["no error was raised"]
    problems = []
    text = str(error)
    if cell.fault in EXPECTED:
        wanted, needle = EXPECTED[cell.fault]
        if not isinstance(error, wanted):
            problems.append(f"expected {wanted.__name__}, got {type(error).__name__}")
        if needle not in text:
            problems.append(f"the error does not say {needle!r}")
    elif cell.phase == "start":  # a raise during start: the worker exits, its traceback in the log lines
        if not isinstance(error, WorkerDied) or "InjectedFault" not in text:
            problems.append(f"expected WorkerDied showing InjectedFault, got {type(error).__name__}")
    else:
        wanted_type = {"raise": "InjectedFault", "nan": "NonFiniteValues", "undecodable": "UndecodableMessage"}
        if not isinstance(error, WorkerError) or error.exc_type != wanted_type[cell.fault]:
            got = getattr(error, "exc_type", type(error).__name__)
            problems.append(f"expected a WorkerError of {wanted_type[cell.fault]}, got {got}")
    if cell.fault not in ("nan", "oversized") and getattr(error, "rank", None) != cell.rank:
        problems.append(f"the error names rank {getattr(error, 'rank', None)}, not rank {cell.rank}")
    bound = LOAD_RAISE_BOUND_S if (cell.phase, cell.fault) == ("load", "raise") else BOUND_S
    if seconds is not None and seconds > bound:
        problems.append(f"the error came {seconds:.1f} s after the fault (bound {bound:.0f} s)")
    return problems


def _judge_still_works(error, fired, value, expected, check_value: bool = True) -> list[str]:
    """A full /dev/shm or squatted names: the job still works and gives the same result (full: a message
    needing a new segment goes through the private folder, with a warning; squatted: the pool's names are
    in a folder of its own). Idle cells have no job: the next job says it all."""
    if fired is None:
        return ["the fault never fired"]
    if error is not None:
        return [f"the job failed: {type(error).__name__}: {_first_line(error)}"]
    return [] if not check_value or _same(value, expected) else ["the job's result differs from the healthy one"]


def _batch_beyond_memory(model: ParallelModel, side: int, cfg: float) -> int:
    """A batch at ``side`` px whose activations need about twice the available RAM (CPU ranks)."""
    from parallel_runtime.service.memory_checks import available_ram, sampling_bytes_per_rank

    shape = (1, model.latent_channels, side // model.spatial_factor, side // model.spatial_factor)
    per_item = sampling_bytes_per_rank(model.info, model.config, shape, 512, cfg != 1.0, model.request.dtype)
    room = available_ram() or 64 * 2**30
    return max(1, min(4096, -(-2 * room // (per_item * len(model.pool.devices)))))


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _captured_warnings():
    """The host's warnings and every line the workers print, while the block runs."""
    lines: list[str] = []
    handler = _ListHandler(lines)
    host, workers = logging.getLogger("parallel_runtime"), logging.getLogger("parallel_runtime.worker")
    level, propagate = workers.level, workers.propagate
    host.addHandler(handler)
    workers.addHandler(handler)
    workers.setLevel(logging.DEBUG)  # worker lines reach the host's log at debug level:
    workers.propagate = False  # taken here, not printed by the root logger
    try:
        yield lines
    finally:
        host.removeHandler(handler)
        workers.removeHandler(handler)
        workers.setLevel(level)
        workers.propagate = propagate


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


def run_matrix(cells: Iterable[Cell], model: str = "tiny-flux", on_result=None) -> list[CellResult]:
    """Run ``cells`` in order (pools reused between them); ``on_result(result)`` after each."""
    matrix = Matrix(model)
    results = []
    try:
        for cell in cells:
            results.append(matrix.run(cell))
            if on_result is not None:
                on_result(results[-1])
    finally:
        matrix.close()
    return results


def summary(results: Sequence[CellResult]) -> dict[str, Any]:
    """Counts and the worst detection time per fault kind (cells that ran)."""
    ran = [r for r in results if not r.outcome.startswith("not applicable")]
    worst: dict[str, float] = {}
    for r in ran:
        fault = r.cell.split(".")[1]
        if r.detection_s is not None:
            worst[fault] = max(worst.get(fault, 0.0), r.detection_s)
    return {
        "cells": len(results),
        "ran": len(ran),
        "passed": sum(r.outcome == "pass" for r in ran),
        "failed": [r.cell for r in ran if r.outcome != "pass"],
        "not_applicable": len(results) - len(ran),
        "max_detection_s_by_fault": worst,
    }
