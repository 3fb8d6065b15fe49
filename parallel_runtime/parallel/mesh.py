"""ParallelMesh: the named device mesh (cfg, pp, ring, ulysses) handed explicitly to every part.

A mesh of world size 1 needs no torch.distributed at all, so the same
engine code runs in-process (the single-device oracle) and inside workers.
"""

from __future__ import annotations

import collections
import dataclasses

import torch
import torch.distributed as dist

from .config import MESH_DIMS, ParallelConfig


@dataclasses.dataclass
class CommStats:
    """Bytes this rank sent to other ranks, per operation name (counted in the collective wrappers)."""

    sent: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, op: str, nbytes: int) -> None:
        self.sent[op] += int(nbytes)
        self.calls[op] += 1

    def total(self, prefix: str = "") -> int:
        return sum(v for k, v in self.sent.items() if k.startswith(prefix))

    def snapshot(self) -> dict[str, int]:
        return dict(self.sent)

    def reset(self) -> None:
        self.sent.clear()
        self.calls.clear()


class ParallelMesh:
    """Process groups for each named dimension plus this rank's coordinates.

    Dimensions: cfg, pp, ring, ulysses, and "sp" (ring x ulysses flattened, ring-major): the group
    over which a token sequence is split. ``rank("sp") == rank("ring") * ulysses + rank("ulysses")``.
    "stage" (cfg x sp flattened, cfg-major): the ranks that run the same blocks, i.e. one PipeFusion
    stage (the whole mesh when pp=1); step caches take their decisions over it.

    Build it with :meth:`build` inside an initialised process group, or :meth:`single` for one
    process. ``group(dim)`` is None when the dimension has size 1 (collectives become no-ops).
    """

    def __init__(
        self,
        config: ParallelConfig,
        device: torch.device,
        groups: dict[str, dist.ProcessGroup | None],
        coords: dict[str, int],
        global_rank: int = 0,
    ):
        self.config = config
        self.device = torch.device(device)
        self._groups = groups
        self._coords = coords
        self.global_rank = global_rank
        self.stats = CommStats()

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> ParallelMesh:
        """A one-rank mesh: no process groups, every collective is a no-op."""
        cfg = ParallelConfig()
        dims = (*MESH_DIMS, "sp", "stage")
        return cls(cfg, torch.device(device), dict.fromkeys(dims), dict.fromkeys(dims, 0))

    @classmethod
    def build(cls, config: ParallelConfig, device: str | torch.device) -> ParallelMesh:
        """Create the mesh over the default process group (which must be initialised).

        Ranks are laid out row-major over (cfg, pp, ring, ulysses). Only dimensions of size > 1
        get a process group, and a dimension spanning the whole world reuses the default group:
        every gloo group runs its own polling thread, which costs idle CPU in a warm pool (we
        therefore do not let ``init_device_mesh`` create a group per dimension).
        """
        device = torch.device(device)
        if config.world_size == 1 and not dist.is_initialized():
            return cls.single(device)
        me = dist.get_rank()
        layout = torch.arange(config.world_size).reshape(config.shape)
        where = (layout == me).nonzero()[0].tolist()
        coords = dict(zip(MESH_DIMS, where))
        coords["sp"] = coords["ring"] * config.ulysses + coords["ulysses"]
        coords["stage"] = coords["cfg"] * config.sp_degree + coords["sp"]
        groups: dict[str, dist.ProcessGroup | None] = {}
        # (name, ranks grouped along it): each row of ``members`` is one group.
        dims = [(name, layout.movedim(i, -1).reshape(-1, config.shape[i])) for i, name in enumerate(MESH_DIMS)]
        sp = layout.reshape(config.cfg, config.pp, config.sp_degree).reshape(-1, config.sp_degree)
        dims.append(("sp", sp))
        stage = layout.reshape(config.cfg, config.pp, config.sp_degree).movedim(1, 0).reshape(config.pp, -1)
        dims.append(("stage", stage))
        for name, members in dims:
            groups[name] = None
            size = members.shape[1]
            if size == 1:
                continue
            if size == config.world_size:
                groups[name] = dist.group.WORLD
                continue
            for row in members.tolist():
                group = dist.new_group(row)  # every rank creates every group, in the same order
                if me in row:
                    groups[name] = group
        return cls(config, device, groups, coords, me)

    # -- coordinates -------------------------------------------------------------------------
    def group(self, dim: str) -> dist.ProcessGroup | None:
        return self._groups[dim]

    def size(self, dim: str) -> int:
        """Degree of ``dim``: one of cfg, pp, ring, ulysses, sp (= ring x ulysses) or stage (= cfg x sp)."""
        if dim == "stage":
            return self.config.cfg * self.config.sp_degree
        return self.config.sp_degree if dim == "sp" else getattr(self.config, dim)

    def rank(self, dim: str) -> int:
        return self._coords[dim]

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def __repr__(self) -> str:
        coords = ", ".join(f"{d}={self._coords[d]}/{getattr(self.config, d)}" for d in MESH_DIMS)
        return f"ParallelMesh(rank={self.global_rank}, {coords}, device={self.device})"
