"""Collectives named by intent. Each counts the bytes this rank sends into ``stats``.

All functions accept ``group=None`` meaning a group of one rank: they then return without
communicating, so single-device code paths need no special cases.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from .mesh import CommStats


def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def all_to_all(
    flat_chunks: Sequence[torch.Tensor],
    group: dist.ProcessGroup | None,
    stats: CommStats,
    recv_numels: Sequence[int],
    op: str = "all_to_all",
) -> list[torch.Tensor]:
    """Send ``flat_chunks[j]`` (1-D) to rank j of ``group``; return the 1-D chunks received from
    each rank (their sizes given by ``recv_numels``). Chunks may have different sizes."""
    n = group_size(group)
    if n == 1:
        return [flat_chunks[0]]
    me = group_rank(group)
    send = torch.cat([c.reshape(-1) for c in flat_chunks])
    recv = torch.empty(sum(recv_numels), dtype=send.dtype, device=send.device)
    dist.all_to_all_single(
        recv,
        send,
        output_split_sizes=list(recv_numels),
        input_split_sizes=[c.numel() for c in flat_chunks],
        group=group,
    )
    stats.add(op, (send.numel() - flat_chunks[me].numel()) * send.element_size())
    return list(torch.split(recv, list(recv_numels)))


def all_reduce_sum(
    tensor: torch.Tensor, group: dist.ProcessGroup | None, stats: CommStats, op: str = "all_reduce"
) -> torch.Tensor:
    """In-place sum over the group; returns ``tensor``."""
    if group_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        n = group_size(group)
        # A ring all-reduce sends 2 (n-1)/n of the buffer per rank.
        stats.add(op, 2 * (n - 1) * tensor.numel() * tensor.element_size() // n)
    return tensor


def all_gather_cat(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    dim: int = 0,
    sizes: Sequence[int] | None = None,
    op: str = "all_gather",
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim``. ``sizes`` gives each rank's extent along
    ``dim`` when they differ (None: all equal to this rank's)."""
    n = group_size(group)
    if n == 1:
        return tensor
    tensor = tensor.contiguous()
    if sizes is None:
        sizes = [tensor.shape[dim]] * n
    parts = []
    for s in sizes:
        shape = list(tensor.shape)
        shape[dim] = s
        parts.append(torch.empty(shape, dtype=tensor.dtype, device=tensor.device))
    if len(set(sizes)) == 1:
        dist.all_gather(parts, tensor, group=group)
        stats.add(op, tensor.numel() * tensor.element_size() * (n - 1))
        return torch.cat(parts, dim=dim)
    # Uneven extents: send this rank's (flattened, gathered-dim-first) tensor to every rank.
    moved = tensor.movedim(dim, 0).contiguous()
    row_numel = moved[0].numel() if moved.shape[0] else int(torch.Size(moved.shape[1:]).numel())
    flat = moved.reshape(-1)
    recv = all_to_all([flat] * n, group, CommStats(), [s * row_numel for s in sizes], op)
    stats.add(op, flat.numel() * flat.element_size() * (n - 1))
    rows = [r.reshape(s, *moved.shape[1:]) for r, s in zip(recv, sizes)]
    return torch.cat(rows, dim=0).movedim(0, dim)


def agree_any(flag: bool, group: dist.ProcessGroup | None = None) -> bool:
    """True on every rank if ``flag`` is true on any rank (a one-element MAX all-reduce).

    Used for cancel: every rank calls it at the same safe point, so none waits alone.
    ``group=None`` here means the whole world when torch.distributed is initialised."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return bool(flag)
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    backend = dist.get_backend(group)
    if backend == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return bool(t.item())


def agree_max(values: list[int], group: dist.ProcessGroup | None = None) -> list[int]:
    """Every rank's ``values`` reduced to their elementwise maximum, on every rank (one small all-reduce;
    the same ranks must call it at the same point, like :func:`agree_any`)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in t.tolist()]


class PendingHalo:
    """Halo rows in flight from :func:`exchange_halo`; ``wait()`` returns (from_up, from_down)."""

    def __init__(self, works: list, from_up: torch.Tensor | None, from_down: torch.Tensor | None, keep: list):
        self._works, self._keep = works, keep  # ``keep`` holds the send buffers until they are sent
        self.from_up, self.from_down = from_up, from_down

    def wait(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        for work in self._works:
            work.wait()
        self._works, self._keep = [], []
        return self.from_up, self.from_down


def exchange_halo(
    band: torch.Tensor,
    halo: int,
    up: int | None,
    down: int | None,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    dim: int = -2,
    op: str = "halo",
) -> PendingHalo:
    """Swap ``halo`` edge slices of ``band`` (along ``dim``) with the neighbouring bands.

    ``up``/``down`` are the group ranks holding the previous/next band, or None at an image
    border. Sends the first ``halo`` slices to ``up`` and the last ones to ``down``; receives
    ``up``'s last and ``down``'s first slices (same shape as ours apart from being ``halo`` thick).
    Non-blocking: call ``wait()`` on the result before using the halos (lets compute overlap).
    Both neighbours must call this at the same point with the same ``halo``."""
    if group is None and (up is not None or down is not None):
        raise ValueError("exchange_halo: neighbours given but the group is None (a single rank has no neighbours)")
    length = band.shape[dim]
    if halo > length and (up is not None or down is not None):
        raise ValueError(f"exchange_halo: band is {length} thick along dim {dim}, thinner than the halo {halo}")
    ops, keep = [], []
    from_up = from_down = None
    if up is not None:
        first = band.narrow(dim, 0, halo).contiguous()
        from_up = torch.empty_like(first)
        keep.append(first)
        ops += [
            dist.P2POp(dist.isend, first, group=group, group_peer=up),
            dist.P2POp(dist.irecv, from_up, group=group, group_peer=up),
        ]
        stats.add(op, first.numel() * first.element_size())
    if down is not None:
        last = band.narrow(dim, length - halo, halo).contiguous()
        from_down = torch.empty_like(last)
        keep.append(last)
        ops += [
            dist.P2POp(dist.isend, last, group=group, group_peer=down),
            dist.P2POp(dist.irecv, from_down, group=group, group_peer=down),
        ]
        stats.add(op, last.numel() * last.element_size())
    works = dist.batch_isend_irecv(ops) if ops else []
    return PendingHalo(works, from_up, from_down, keep)


def gather_to(
    tensor: torch.Tensor,
    dst: int,
    sizes: Sequence[int],
    group: dist.ProcessGroup | None,
    stats: CommStats,
    dim: int = 0,
    op: str = "gather_to",
) -> torch.Tensor | None:
    """Concatenate every rank's ``tensor`` along ``dim`` on group rank ``dst`` only (others get
    None). ``sizes[r]`` is rank r's extent along ``dim``; ranks with size 0 send nothing. Point to
    point, so only ``dst`` ever holds the whole result."""
    n = group_size(group)
    if n == 1:
        return tensor
    me = group_rank(group)
    if me != dst:
        if sizes[me] > 0:
            payload = tensor.contiguous()
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, payload, group=group, group_peer=dst)]):
                work.wait()
            stats.add(op, payload.numel() * payload.element_size())
        return None
    parts, ops = [], []
    for r, size in enumerate(sizes):
        if r == me:
            parts.append(tensor)
            continue
        shape = list(tensor.shape)
        shape[dim] = size
        buf = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
        parts.append(buf)
        if size > 0:
            ops.append(dist.P2POp(dist.irecv, buf, group=group, group_peer=r))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return torch.cat(parts, dim=dim)


class PendingShift:
    """A ring shift in flight (see :func:`ring_shift_start`); ``wait()`` returns the received tensor."""

    def __init__(self, works: list, received: torch.Tensor, sent: torch.Tensor | None = None):
        self._works = works
        self._received = received
        self._sent = sent  # kept alive until the send completes

    def wait(self) -> torch.Tensor:
        for work in self._works:
            work.wait()
        self._works, self._sent = [], None
        return self._received


def ring_shift_start(
    tensor: torch.Tensor,
    recv_shape: Sequence[int],
    group: dist.ProcessGroup | None,
    stats: CommStats,
    op: str = "ring",
) -> PendingShift:
    """Send ``tensor`` to the next rank of the ring and receive the previous rank's tensor (of
    ``recv_shape``), without waiting, so compute can overlap the transfer.

    ``tensor`` must not be modified until ``wait()`` returns. With a group of one rank the
    "received" tensor is ``tensor`` itself."""
    n = group_size(group)
    if n == 1:
        return PendingShift([], tensor)
    me = group_rank(group)
    nxt, prv = (me + 1) % n, (me - 1) % n
    tensor = tensor.contiguous()
    out = torch.empty(tuple(recv_shape), dtype=tensor.dtype, device=tensor.device)
    ops = [
        dist.P2POp(dist.isend, tensor, group=group, group_peer=nxt),
        dist.P2POp(dist.irecv, out, group=group, group_peer=prv),
    ]
    works = dist.batch_isend_irecv(ops)
    stats.add(op, tensor.numel() * tensor.element_size())
    return PendingShift(works, out, tensor)


# -- point to point (PipeFusion) ------------------------------------------------------------------
class PendingP2P:
    """A point-to-point send or receive in flight (see :func:`send_start` / :func:`recv_start`).

    ``wait(timeout_s)`` returns the tensor (the received data, or the sent tensor) and raises
    :class:`~parallel_runtime.errors.RuntimeTimeout` naming ``what`` when the peer does not answer."""

    def __init__(self, work: object | None, tensor: torch.Tensor, what: str):
        self._work, self.tensor, self.what = work, tensor, what

    def done(self) -> bool:
        """True once the transfer has completed (never blocks)."""
        return self._work is None or bool(self._work.is_completed())

    def wait(self, timeout_s: float | None = None) -> torch.Tensor:
        if self._work is not None:
            import datetime

            from ..errors import RuntimeTimeout

            try:
                if timeout_s is None:
                    self._work.wait()
                else:
                    self._work.wait(timeout=datetime.timedelta(seconds=timeout_s))
            except RuntimeError as exc:
                if "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
                    raise RuntimeTimeout(f"waited {timeout_s} s for {self.what}: {exc}") from exc
                raise
            self._work = None
        return self.tensor


def send_start(
    tensor: torch.Tensor,
    peer: int,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    op: str = "p2p",
    tag: int = 0,
) -> PendingP2P:
    """Post a non-blocking send of ``tensor`` to group rank ``peer``; bytes are counted under ``op``.

    ``tensor`` must stay unmodified until the returned handle's ``wait()``."""
    tensor = tensor.contiguous()
    if group_size(group) == 1:
        raise ValueError("send_start: a group of one rank has no peer to send to")
    work = dist.isend(tensor, group=group, group_dst=peer, tag=tag)
    stats.add(op, tensor.numel() * tensor.element_size())
    return PendingP2P(work, tensor, f"the send of {op} ({tuple(tensor.shape)}) to group rank {peer}")


def recv_start(
    buffer: torch.Tensor, peer: int, group: dist.ProcessGroup | None, op: str = "p2p", tag: int = 0
) -> PendingP2P:
    """Post a non-blocking receive into ``buffer`` (its shape and dtype must match the send) from
    group rank ``peer``. Posting receives ahead lets the transfer overlap compute."""
    if group_size(group) == 1:
        raise ValueError("recv_start: a group of one rank has no peer to receive from")
    work = dist.irecv(buffer, group=group, group_src=peer, tag=tag)
    return PendingP2P(work, buffer, f"{op} ({tuple(buffer.shape)}) from group rank {peer}")


def send_object(
    obj: object,
    peer: int,
    group: dist.ProcessGroup | None,
    stats: CommStats,
    device: torch.device,
    op: str = "p2p_object",
    tag: int = 0,
    timeout_s: float | None = None,
) -> None:
    """Send an object made of plain containers, numbers, strings and tensors (saved with torch.save)
    to group rank ``peer``: its length, then its bytes. Blocking; for one-off setup messages."""
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(device)
    length = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    for t in (length, payload):
        send_start(t, peer, group, stats, op, tag).wait(timeout_s)


def recv_object(
    peer: int,
    group: dist.ProcessGroup | None,
    device: torch.device,
    op: str = "p2p_object",
    tag: int = 0,
    timeout_s: float | None = None,
) -> object:
    """Receive an object sent with :func:`send_object` (tensors come back on the CPU)."""
    import io

    length = torch.empty(1, dtype=torch.int64, device=device)
    recv_start(length, peer, group, op, tag).wait(timeout_s)
    payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    recv_start(payload, peer, group, op, tag).wait(timeout_s)
    return torch.load(io.BytesIO(payload.cpu().numpy().tobytes()), map_location="cpu", weights_only=True)
