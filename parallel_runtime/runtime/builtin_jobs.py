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
    """Reads every byte of a received tensor and returns a checksum of them (transfer benchmark)."""
    flat = tensor.reshape(-1).view(torch.uint8) if tensor.numel() else torch.empty(0, dtype=torch.uint8)
    return {"nbytes": tensor.numel() * tensor.element_size(), "checksum": checksum(flat)}


def checksum(flat: torch.Tensor) -> int:
    """Wrapping sum of a flat uint8 tensor read as 64-bit words (the tail bytes added one by one):
    reads every byte, at memory speed (a byte-wise sum is ~10x slower)."""
    whole = flat.numel() // 8 * 8
    try:
        words = flat[:whole].view(torch.int64).sum()
    except RuntimeError:  # storage not 8-byte aligned: add the bytes themselves
        return int(flat.sum(dtype=torch.int64))
    return int(words) + int(flat[whole:].sum(dtype=torch.int64))


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
