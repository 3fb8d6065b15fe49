"""Small jobs built into every worker: health checks, the demo, benchmarks and runtime tests."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..parallel.collectives import all_reduce_sum
from .jobs import JobContext


def noop(ctx: JobContext) -> None:
    """Does nothing (round-trip latency)."""
    return None


def echo(ctx: JobContext, *values: Any) -> Any:
    """Returns its arguments unchanged (one value: the value itself)."""
    return values[0] if len(values) == 1 else values


def info(ctx: JobContext) -> dict[str, Any]:
    """Rank, device, mesh coordinates and memory of this worker."""
    from .jobs import memory_info

    return {"rank": ctx.rank, "device": str(ctx.device), "mesh": repr(ctx.mesh), **memory_info(ctx.device)}


def tensor_sink(ctx: JobContext, tensor: torch.Tensor) -> dict[str, Any]:
    """Touches every byte of a received tensor and reports its checksum (transfer benchmark)."""
    flat = tensor.reshape(-1).view(torch.uint8) if tensor.numel() else tensor.reshape(-1)
    return {"nbytes": tensor.numel() * tensor.element_size(), "sum": int(flat[::4096].sum()) if flat.numel() else 0}


def sleep_steps(ctx: JobContext, steps: int, step_s: float = 0.05) -> int:
    """A 'long job': ``steps`` steps with a progress event and a collective cancel check each."""
    for i in range(steps):
        ctx.check_cancel()
        time.sleep(step_s)
        if ctx.rank == 0:
            ctx.emit("progress", {"step": i + 1, "total": steps})
    return steps


def fail_on_rank(ctx: JobContext, rank: int, message: str = "deliberate failure") -> int:
    """Raises on one rank (error-path tests); the others return their rank."""
    if ctx.rank == rank:
        raise ValueError(f"{message} on rank {rank}")
    return ctx.rank


def all_reduce_demo(ctx: JobContext, size: int = 4) -> torch.Tensor:
    """Every rank contributes (rank + 1) * ones(size); returns the sum over the world."""
    import torch.distributed as dist

    t = torch.full((size,), float(ctx.rank + 1), device=ctx.device)
    if dist.is_initialized() and ctx.world_size > 1:
        all_reduce_sum(t, dist.group.WORLD, ctx.mesh.stats)
    return t.cpu()
