"""Worker-side jobs for tests/test_attention.py: each rank shards the full q/k/v by its sp rank,
runs SequenceParallelAttention, and returns its local output and the bytes it sent in this job."""

from __future__ import annotations

import torch

from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.sharding import shard


def _sent_since(ctx, before: dict[str, int]) -> dict[str, int]:
    """Bytes sent per op name since ``before`` (the pool's mesh lives across jobs)."""
    now = ctx.mesh.stats.snapshot()
    return {op: n - before.get(op, 0) for op, n in now.items() if n - before.get(op, 0)}


def run_usp(
    ctx,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    backend: str = "auto",
    calls: int = 1,
    via_intercept: bool = False,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Attention of this rank's sequence shard; ``calls`` > 1 repeats it (same object)."""
    attn = SequenceParallelAttention(ctx.mesh, backend)
    ql, kl, vl = (shard(t.to(ctx.device), 2, ctx.mesh) for t in (q, k, v))
    before = ctx.mesh.stats.snapshot()
    out = None
    for _ in range(calls):
        attn.begin_forward(("run_usp", tuple(q.shape)))  # same layout every call: exchanged once
        if via_intercept:
            with attn.intercept():
                out = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, scale=scale, enable_gqa=enable_gqa)
        else:
            out = attn(ql, kl, vl, scale=scale, enable_gqa=enable_gqa)
    return out.cpu(), _sent_since(ctx, before)


def run_joint(
    ctx,
    text_q: torch.Tensor,
    text_k: torch.Tensor,
    text_v: torch.Tensor,
    image_q: torch.Tensor,
    image_k: torch.Tensor,
    image_v: torch.Tensor,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Joint attention: the local sequence is [text shard, image shard]. Returns the local output
    and the full-sequence index ([text..., image...] order) of every local token."""
    mesh = ctx.mesh
    attn = SequenceParallelAttention(mesh, backend)
    n_text = text_q.shape[2]
    local = [
        torch.cat([shard(t.to(ctx.device), 2, mesh), shard(i.to(ctx.device), 2, mesh)], dim=2)
        for t, i in ((text_q, image_q), (text_k, image_k), (text_v, image_v))
    ]
    text_idx = shard(torch.arange(n_text), 0, mesh)
    image_idx = shard(torch.arange(image_q.shape[2]) + n_text, 0, mesh)
    return attn(*local).cpu(), torch.cat([text_idx, image_idx])


def run_rejected(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **call_kwargs) -> str:
    """Call with unsupported arguments; return the ConfigError message ("" if none was raised)."""
    attn = SequenceParallelAttention(ctx.mesh, "sdpa")
    ql, kl, vl = (shard(t.to(ctx.device), 2, ctx.mesh) for t in (q, k, v))
    if "attn_mask" in call_kwargs and call_kwargs["attn_mask"] is not None:
        call_kwargs["attn_mask"] = call_kwargs["attn_mask"].to(ctx.device)
    try:
        attn(ql, kl, vl, **call_kwargs)
    except ConfigError as exc:
        return str(exc)
    return ""
