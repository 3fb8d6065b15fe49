"""Worker-side fault injection for the fault matrix (``bench soak`` and tests/test_fault_matrix.py).

:func:`install` is a pool's ``worker_setup``: every worker runs it before joining the process group.
It wraps the functions each phase runs — pool start (install itself), model load, a transformer
block during denoising (every layout: USP, CFG, PipeFusion), the VAE decode, text encoding — and a
wrapper fires when ``<plan_dir>/plan.json`` names this rank and phase while the plan's one-shot token
``armed-<cell>`` exists. Firing removes the token first (``unlink`` is atomic: exactly one process
wins), so a pool restarted after the fault runs clean; it also writes ``fired-<cell>`` holding the
wall-clock time, from which the matrix measures how long detection took.

Faults: ``kill`` / ``stop`` (the rank sends itself SIGKILL / SIGSTOP at that exact point), ``raise``
(an :class:`InjectedFault`), ``skew`` (at start: the rank's READY names other code than the host's,
as a worker started from a package edited while the host ran would; such a worker refuses its spec
even earlier, which tests/test_protocol.py covers with a real edited copy), ``shm-full`` (the rank fills /dev/shm to the last byte, refused unless
/dev/shm is a small private tmpfs: see :func:`shm_is_private`), ``squat`` (another local user takes every
segment name of the pool's host it can see or guess, :mod:`.stranger`; what it created is listed in
``squatted-<cell>.json`` for the matrix to remove), ``nan`` (NaN in the model's output / the decoder's input / the text
embeddings), ``undecodable`` (the job's result on rank 0, an event elsewhere: a value the host
cannot unpickle). Pools without this hook run none of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

INJECTED_PHASES = ("start", "load", "denoise", "decode", "encode")
FAULTS = ("kill", "stop", "raise", "nan", "undecodable", "shm-full", "skew", "squat")
FILLER = Path("/dev/shm/dpar-fault-filler")  # what a shm-full fault writes until /dev/shm is full
PRIVATE_SHM_MAX_BYTES = 256 * 2**20  # /dev/shm is filled only when it is a tmpfs this small
RESULT_RANK = 0  # the rank whose return value the model API's jobs send back
SKEWED_CODE = "5ca1ab1e5ca1ab1e"  # the code hash a skew fault's READY names (no real hash is this)


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """One cell: which rank misbehaves, in which phase, how. ``after_calls``: a denoise fault fires
    at this rank's n-th transformer block call of the job (mid-sampling, not at its first call)."""

    cell: str
    rank: int
    phase: str
    fault: str
    after_calls: int = 5

    def arm(self, plan_dir: str | os.PathLike) -> None:
        folder = Path(plan_dir)
        disarm(folder)
        (folder / "plan.json").write_text(json.dumps(dataclasses.asdict(self)))
        (folder / f"armed-{self.cell}").touch()


def disarm(plan_dir: str | os.PathLike) -> None:
    """Remove the plan, its token and its fired record."""
    for path in Path(plan_dir).glob("*"):
        path.unlink(missing_ok=True)


def fired_at(plan_dir: str | os.PathLike, cell: str) -> float | None:
    """Wall-clock time the cell's fault fired (None if it did not)."""
    try:
        return float((Path(plan_dir) / f"fired-{cell}").read_text())
    except (OSError, ValueError):
        return None


def shm_is_private() -> bool:
    """True when /dev/shm is small enough to be the matrix's own tmpfs (in a private mount
    namespace): the machine's real /dev/shm is never filled."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return False
    return st.f_blocks * st.f_frsize <= PRIVATE_SHM_MAX_BYTES


def fill_shared_memory() -> int:
    """Claim every free byte of /dev/shm in FILLER; returns the bytes claimed."""
    if not shm_is_private():
        raise RuntimeError("refusing to fill /dev/shm: it is not a small private tmpfs")
    st = os.statvfs("/dev/shm")
    size = st.f_bavail * st.f_frsize
    fd = os.open(FILLER, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        while size > 0:
            try:
                os.posix_fallocate(fd, 0, size)
                break
            except OSError:
                size -= 4096  # the last pages may be taken meanwhile
    finally:
        os.close(fd)
    return max(size, 0)


def squat_as_stranger(plan_dir: str | os.PathLike, cell: str, host_pid: int) -> list[str]:
    """Another user squats every name of ``host_pid``'s pools it can see or guess; the paths it created
    are written to ``squatted-<cell>.json`` in ``plan_dir`` (see :func:`take_squats`)."""
    from .stranger import run_as_stranger, squat, visible_labels

    report = run_as_stranger(squat, visible_labels(host_pid))
    created = report["created"] + report["entered"]
    (Path(plan_dir) / f"squatted-{cell}.json").write_text(json.dumps(created))
    return created


def take_squats(plan_dir: str | os.PathLike, cell: str) -> list[str]:
    """The paths a squat cell created (and forget the record)."""
    record = Path(plan_dir) / f"squatted-{cell}.json"
    try:
        created = json.loads(record.read_text())
    except (OSError, ValueError):
        return []
    record.unlink(missing_ok=True)
    return created


class InjectedFault(RuntimeError):
    """What a ``raise`` cell throws."""


def pretend_other_code() -> None:
    """From now on this worker's READY names SKEWED_CODE instead of its own code hash."""
    from parallel_runtime.runtime import worker_loop
    from parallel_runtime.runtime.protocol import PROTOCOL_VERSION, Ready

    def ready_message(self, info):
        return Ready(self.rank, PROTOCOL_VERSION, SKEWED_CODE, info)

    worker_loop.Worker.ready_message = ready_message


WORKER_ONLY_MODULE = "dpar_fault_injection_worker_only"


class HostCannotImport:
    """Pickles as a call to a function of a module that exists only in the worker (registered by
    :func:`install`): unpickling it on the host fails with ModuleNotFoundError."""

    def __reduce__(self):
        return (sys.modules[WORKER_ONLY_MODULE].make, ())


def _register_worker_only_module() -> None:
    module = types.ModuleType(WORKER_ONLY_MODULE)

    def make() -> None:  # only the host would call it, and it cannot import it
        return None

    make.__module__, make.__qualname__ = WORKER_ONLY_MODULE, "make"
    module.make = make
    sys.modules[WORKER_ONLY_MODULE] = module


class Injector:
    """This rank's view of the plan folder."""

    def __init__(self, rank: int, plan_dir: str):
        self.rank, self.plan_dir = rank, Path(plan_dir)
        self.block_calls: dict[str, int] = {}  # cell -> block calls seen while it was armed

    def plan(self, phase: str, faults: tuple[str, ...] = FAULTS) -> FaultPlan | None:
        """The armed plan for this rank, ``phase`` and one of ``faults``; None otherwise."""
        try:
            plan = FaultPlan(**json.loads((self.plan_dir / "plan.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None
        if plan.rank != self.rank or plan.phase != phase or plan.fault not in faults:
            return None
        return plan if (self.plan_dir / f"armed-{plan.cell}").exists() else None

    def take(self, plan: FaultPlan) -> bool:
        """Consume the one-shot token (True for the one caller that got it) and record the time."""
        try:
            os.unlink(self.plan_dir / f"armed-{plan.cell}")
        except FileNotFoundError:
            return False
        (self.plan_dir / f"fired-{plan.cell}").write_text(repr(time.time()))
        return True

    def fire(self, phase: str) -> None:
        """Do a kill / stop / raise / shm-full / skew / squat planned for ``phase`` here and now."""
        plan = self.plan(phase, ("kill", "stop", "raise", "shm-full", "skew", "squat"))
        if plan is None or not self.take(plan):
            return
        if plan.fault == "squat":
            squat_as_stranger(self.plan_dir, plan.cell, os.getppid())
        elif plan.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif plan.fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif plan.fault == "shm-full":
            fill_shared_memory()
        elif plan.fault == "skew":
            pretend_other_code()
        else:
            raise InjectedFault(f"injected fault: rank {self.rank} raised during {phase} (cell {plan.cell})")

    def nan(self, phase: str, value: Any) -> Any:
        """``value`` (a float tensor) filled with NaN if a nan fault is planned for ``phase`` here."""
        plan = self.plan(phase, ("nan",))
        if plan is None or not self.take(plan):
            return value
        import torch

        return torch.full_like(value, float("nan"))

    def undecodable(self, phase: str, ctx: Any, value: Any) -> Any:
        """The job's result (rank 0) replaced by, or an event (other ranks) carrying, something the
        host cannot unpickle, if planned for ``phase`` here."""
        plan = self.plan(phase, ("undecodable",))
        if plan is None or not self.take(plan):
            return value
        if ctx.rank == RESULT_RANK:
            return HostCannotImport()
        ctx.emit("progress", HostCannotImport())
        return value

    def block_fault(self, phase: str, out: Any) -> Any:
        """Called after each transformer block: at the plan's n-th call, kill/stop/raise, or NaN the
        block's image tokens."""
        plan = self.plan(phase)
        if plan is None or plan.fault == "undecodable":
            return out
        calls = self.block_calls[plan.cell] = self.block_calls.get(plan.cell, 0) + 1
        if calls < plan.after_calls:
            return out
        if plan.fault == "nan":
            return out.replace(img=self.nan(phase, out.img))
        self.fire(phase)
        return out


def _wrap_job(module: Any, name: str, phase: str, inj: Injector, fire_first: bool = False) -> None:
    """Replace job ``module.name`` (the workers look jobs up by module and name) by one that may
    fire at its start and may turn its result undecodable."""
    job = getattr(module, name)

    def job_with_faults(ctx, *args, **kwargs):
        if fire_first:
            inj.fire(phase)
        return inj.undecodable(phase, ctx, job(ctx, *args, **kwargs))

    setattr(module, name, job_with_faults)


def install(rank: int, world: int, plan_dir: str) -> None:
    """``worker_setup`` entry: fire a start fault now, wrap the other phases' functions."""
    from parallel_runtime.models import base, text_encoding
    from parallel_runtime.pipefusion import pipeline
    from parallel_runtime.service import load_job, model_jobs
    from parallel_runtime.vae import decode as vae_decode

    _register_worker_only_module()
    inj = Injector(rank, plan_dir)
    inj.fire("start")

    load_parts = load_job._load_transformer_and_vae

    def load_parts_with_fault(ctx, *args, **kwargs):
        inj.fire("load")  # after the load's first collective: this rank is loading weights now
        return load_parts(ctx, *args, **kwargs)

    load_job._load_transformer_and_vae = load_parts_with_fault
    _wrap_job(load_job, "load_model", "load", inj)

    run_block = base.ModelAdapter.run_block

    def run_block_with_fault(self, acts, i, attention):
        return inj.block_fault("denoise", run_block(self, acts, i, attention))

    base.ModelAdapter.run_block = run_block_with_fault
    run_block_stale = pipeline.run_block_stale

    def run_block_stale_with_fault(adapter, acts, i, cache):
        return inj.block_fault("denoise", run_block_stale(adapter, acts, i, cache))

    pipeline.run_block_stale = run_block_stale_with_fault
    _wrap_job(model_jobs, "generate", "denoise", inj)

    decode_image = vae_decode.decode_to_image_tensor

    def decode_with_fault(vae, z, *args, **kwargs):
        inj.fire("decode")
        return decode_image(vae, inj.nan("decode", z), *args, **kwargs)

    vae_decode.decode_to_image_tensor = decode_with_fault
    _wrap_job(model_jobs, "decode", "decode", inj)

    encode_prompt = text_encoding.encode_prompt

    def encode_with_fault(*args, **kwargs):
        inj.fire("encode")
        cond = encode_prompt(*args, **kwargs)
        return dataclasses.replace(cond, prompt_embeds=inj.nan("encode", cond.prompt_embeds))

    text_encoding.encode_prompt = encode_with_fault
    # Only the text rank encodes; the others return at once: a fault on them fires at the job's start.
    _wrap_job(model_jobs, "encode_text", "encode", inj, fire_first=rank != load_job.TEXT_RANK)
