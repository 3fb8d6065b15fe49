"""Ulysses all-to-all: [sequence-sharded, all heads] <-> [whole group sequence, a share of heads].

Before attention each rank of the ulysses group holds its own tokens for all H heads; one
all-to-all gives every rank all the group's tokens for its share of heads (heads split with
:func:`~parallel_runtime.parallel.sharding.split_sizes`, so H need not divide by the group size). After
attention the inverse all-to-all restores the sequence split. Token shards may differ in length:
``seq_lens[j]`` is the token count of group rank j, in sequence order.

Per rank and attention layer the two exchanges send 4 x (N-1)/N of its local q/k/v/out bytes,
i.e. 4·e·B·S·h·(N-1)/N² for an even split of S tokens with hidden size h over N ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..parallel.collectives import all_to_all, group_rank, group_size
from ..parallel.mesh import CommStats
from ..parallel.sharding import split_offsets, split_sizes


def scatter_heads(
    tensors: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None,
    stats: CommStats,
    seq_lens: Sequence[int],
    op: str = "ulysses",
) -> list[torch.Tensor]:
    """[B, H, S_local, D] each -> [B, H_mine, sum(seq_lens), D] each, in one all-to-all.

    All tensors share B, H and S_local (their D may differ, e.g. v). Returns them in input order."""
    n = group_size(group)
    if n == 1:
        return list(tensors)
    me = group_rank(group)
    b, h = tensors[0].shape[0], tensors[0].shape[1]
    heads, head_offsets = split_sizes(h, n), split_offsets(h, n)
    dims = [t.shape[-1] for t in tensors]
    send = [torch.cat([t.narrow(1, head_offsets[j], heads[j]).reshape(-1) for t in tensors]) for j in range(n)]
    recv_numels = [b * heads[me] * seq_lens[j] * sum(dims) for j in range(n)]
    received = all_to_all(send, group, stats, recv_numels, op)
    outs: list[list[torch.Tensor]] = [[] for _ in tensors]
    for j, flat in enumerate(received):
        pieces = torch.split(flat, [b * heads[me] * seq_lens[j] * d for d in dims])
        for i, (piece, d) in enumerate(zip(pieces, dims)):
            outs[i].append(piece.view(b, heads[me], seq_lens[j], d))
    return [torch.cat(parts, dim=2) for parts in outs]


def gather_heads(
    x: torch.Tensor,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    seq_lens: Sequence[int],
    num_heads: int,
    op: str = "ulysses",
) -> torch.Tensor:
    """Inverse of :func:`scatter_heads` for one tensor: [B, H_mine, sum(seq_lens), D] ->
    [B, num_heads, seq_lens[me], D]."""
    n = group_size(group)
    if n == 1:
        return x
    me = group_rank(group)
    b, d = x.shape[0], x.shape[-1]
    heads = split_sizes(num_heads, n)
    send = [part.reshape(-1) for part in torch.split(x, list(seq_lens), dim=2)]
    recv_numels = [b * heads[j] * seq_lens[me] * d for j in range(n)]
    received = all_to_all(send, group, stats, recv_numels, op)
    return torch.cat([flat.view(b, heads[j], seq_lens[me], d) for j, flat in enumerate(received)], dim=1)
