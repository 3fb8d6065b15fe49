"""Ring attention: K/V blocks travel around the ring group; partial results merge by log-sum-exp.

Each rank keeps its query block and, in N steps, attends to every rank's K/V block: at each step
it posts the shift of the block it holds to the next rank (the transfer overlaps the compute),
attends to that block with a kernel that also returns the logsumexp, and merges the partial output
into a running (out, lse) pair exactly. Blocks may have different lengths (``block_lens[j]`` is
ring rank j's token count, known to every rank).

Per rank and attention layer K and V each make N-1 hops: 2·e·B·S·h·(N-1)/N bytes for an even
split of S tokens with hidden size h over N ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..parallel.collectives import group_rank, group_size, ring_shift_start
from ..parallel.mesh import CommStats

AttendLse = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], tuple[torch.Tensor, torch.Tensor]]


def merge_partial(
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    block_out: torch.Tensor,
    block_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention over two disjoint key sets, given each one's output and logsumexp.

    With L = logaddexp(lse, block_lse): out' = out·exp(lse − L) + block_out·exp(block_lse − L),
    lse' = L. Accumulates in float32 (or wider). ``out``/``lse`` None starts the accumulation.
    A block whose lse is −inf everywhere (no keys) leaves the result unchanged."""
    acc = torch.promote_types(block_out.dtype, torch.float32)
    block_out = block_out.to(acc)
    block_lse = block_lse.to(torch.promote_types(block_lse.dtype, torch.float32))
    if out is None or lse is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    # Where both are -inf (no keys seen yet) logaddexp is -inf and the differences are nan: weight 0.
    w_old = torch.nan_to_num(torch.exp(lse - new_lse), nan=0.0).unsqueeze(-1)
    w_new = torch.nan_to_num(torch.exp(block_lse - new_lse), nan=0.0).unsqueeze(-1)
    return out * w_old + block_out * w_new, new_lse


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([k.reshape(-1), v.reshape(-1)])


def _unpack(kv: torch.Tensor, b: int, h: int, length: int, dk: int, dv: int) -> tuple[torch.Tensor, torch.Tensor]:
    nk = b * h * length * dk
    return kv[:nk].view(b, h, length, dk), kv[nk:].view(b, h, length, dv)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    block_lens: Sequence[int],
    attend_lse: AttendLse,
    scale: float | None = None,
    op: str = "ring",
) -> torch.Tensor:
    """Attention of this rank's queries over the K/V of every rank of ``group``.

    q, k, v: [B, H, S_mine, D] with S_mine == block_lens[my ring rank]. Returns [B, H, S_mine, Dv]."""
    n = group_size(group)
    if n == 1:
        return attend_lse(q, k, v, scale)[0]
    me = group_rank(group)
    b, h, dk, dv = q.shape[0], q.shape[1], k.shape[-1], v.shape[-1]
    kv = _pack(k, v)
    out = lse = None
    for step in range(n):
        src = (me - step) % n  # the ring rank whose K/V block we hold at this step
        pending = None
        if step < n - 1:
            nxt = (me - step - 1) % n
            pending = ring_shift_start(kv, (b * h * block_lens[nxt] * (dk + dv),), group, stats, op)
        if block_lens[src] and q.shape[2]:
            blk_k, blk_v = _unpack(kv, b, h, block_lens[src], dk, dv)
            blk_out, blk_lse = attend_lse(q, blk_k, blk_v, scale)
            out, lse = merge_partial(out, lse, blk_out, blk_lse)
        if pending is not None:
            kv = pending.wait()
    if out is None:  # no queries here (or no keys anywhere)
        return q.new_zeros((b, h, q.shape[2], dv))
    return out.to(q.dtype)
