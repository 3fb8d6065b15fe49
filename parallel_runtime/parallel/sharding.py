"""Splitting tensors over a mesh dimension (uneven sizes allowed) and gathering them back."""

from __future__ import annotations

import torch

from .collectives import all_gather_cat
from .mesh import ParallelMesh


def split_sizes(n: int, parts: int) -> list[int]:
    """Balanced split of ``n`` items into ``parts``: the first ``n % parts`` parts get one more."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_offsets(n: int, parts: int) -> list[int]:
    """Start offset of each part of :func:`split_sizes`."""
    offsets, acc = [], 0
    for s in split_sizes(n, parts):
        offsets.append(acc)
        acc += s
    return offsets


def shard(tensor: torch.Tensor, dim: int, mesh: ParallelMesh, mesh_dim: str = "sp") -> torch.Tensor:
    """This rank's slice of ``tensor`` along ``dim`` when split over ``mesh_dim``."""
    n = mesh.size(mesh_dim)
    if n == 1:
        return tensor
    r = mesh.rank(mesh_dim)
    sizes = split_sizes(tensor.shape[dim], n)
    return tensor.narrow(dim, split_offsets(tensor.shape[dim], n)[r], sizes[r])


def gather(local: torch.Tensor, dim: int, full_len: int, mesh: ParallelMesh, mesh_dim: str = "sp") -> torch.Tensor:
    """Inverse of :func:`shard`: concatenate every rank's slice along ``dim``."""
    n = mesh.size(mesh_dim)
    if n == 1:
        return local
    return all_gather_cat(local, mesh.group(mesh_dim), mesh.stats, dim=dim, sizes=split_sizes(full_len, n), op="gather")
