"""Worker-side jobs for the runtime tests."""

from __future__ import annotations

import sys
import time
import types

import torch
import torch.distributed as dist


def ignore_cancel(ctx, seconds: float) -> float:
    """A job that never reaches a safe point (no check_cancel): only a restart can stop it."""
    time.sleep(seconds)
    return seconds


def stall_on_rank(ctx, rank: int, seconds: float) -> int:
    """``rank`` computes (sleeps) for ``seconds`` without progress while the others wait for it in
    an all-reduce: a stalled rank as a driver hang would make it."""
    if ctx.rank == rank:
        time.sleep(seconds)
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t.item())


def fail_then_collective(ctx, rank: int) -> int:
    """``rank`` raises before an all-reduce the others enter: they wait for it forever."""
    if ctx.rank == rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    t = torch.ones(1)
    dist.all_reduce(t)
    return ctx.rank


WORKER_ONLY = "dpar_test_worker_only_module"


class _OnlyOnWorkers:
    """Pickles as a call into a module that exists only in the worker process."""

    def __reduce__(self):
        return (sys.modules[WORKER_ONLY].make, ())


def _worker_only_module() -> None:
    if WORKER_ONLY not in sys.modules:
        module = types.ModuleType(WORKER_ONLY)

        def make() -> None:
            return None

        make.__module__, make.__qualname__ = WORKER_ONLY, "make"
        module.make = make
        sys.modules[WORKER_ONLY] = module


def undecodable_result(ctx, rank: int):
    """``rank`` returns (as result rank) a value the host cannot unpickle."""
    _worker_only_module()
    return _OnlyOnWorkers() if ctx.rank == rank else ctx.rank


def undecodable_event(ctx, rank: int) -> int:
    """``rank`` sends an event the host cannot unpickle, then returns normally."""
    _worker_only_module()
    if ctx.rank == rank:
        ctx.emit("progress", _OnlyOnWorkers())
    return ctx.rank


def slow_component_loads(rank: int, world: int, seconds: float) -> None:
    """``worker_setup`` hook: every model component takes ``seconds`` longer to load (a large model
    on a slow disk), so a load takes long enough to be cancelled between two components."""
    import diffusers
    import transformers

    import parallel_runtime.service.load_job  # noqa: F401 - imported now, not while the test times the load
    from parallel_runtime.models import loading

    for name in ("FluxTransformer2DModel", "AutoencoderKL"):
        getattr(diffusers, name)
    for name in ("CLIPTextModel", "T5EncoderModel", "CLIPTokenizer", "T5TokenizerFast"):
        getattr(transformers, name)
    real = loading.component_class

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    loading.component_class = slow


def slow_blocks(rank: int, world: int, seconds: float) -> None:
    """``worker_setup`` hook: every transformer block takes ``seconds`` longer (a large model at a large
    size), so one denoising step lasts long enough to be cancelled in its middle."""
    from parallel_runtime.models import base

    real = base.ModelAdapter.run_block

    def slow(self, acts, i, attention):
        time.sleep(seconds)
        return real(self, acts, i, attention)

    base.ModelAdapter.run_block = slow


def step_memory_growth(ctx, cond, latent_shape: tuple[int, ...], cfg: float = 1.0) -> int:
    """One denoising step of the loaded model on zeros of ``latent_shape``: the peak of the bytes torch
    held for the step above what it held before (bytes).

    Counted from torch's own allocation events (the profiler's memory records), not from the process's
    RSS: peak RSS depends on the C allocator's history and the CPU's kernels (CI's CPU measured 30 %
    below this machine's for the same step), while the estimate is about tensors, as a GPU's caching
    allocator sees them. A step on a tiny latent runs first so lazily created buffers are not counted."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from parallel_runtime.denoise.loop import denoise_latent
    from parallel_runtime.denoise.model_sampling import model_sampling_for
    from parallel_runtime.denoise.settings import SamplingSettings
    from parallel_runtime.service.load_job import loaded_model

    model = loaded_model(ctx)
    settings = SamplingSettings(seed=1, steps=1, cfg=cfg)
    negative = cond if cfg != 1.0 else None
    ms = model_sampling_for(model.adapter)
    warmup_shape = (*latent_shape[:2], *(min(side, 8) for side in latent_shape[2:]))
    denoise_latent(model.adapter, ctx.mesh, ms, cond, negative, torch.zeros(warmup_shape), settings)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        denoise_latent(model.adapter, ctx.mesh, ms, cond, negative, torch.zeros(latent_shape), settings)
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for record in sorted(records, key=lambda e: e.start_ns()):
        held += record.nbytes()
        peak = max(peak, held)
    return peak
