"""ParallelMesh: the named device mesh (cfg, pp, ring, ulysses) handed explicitly to every part.

Wraps torch's DeviceMesh. A mesh of world size 1 needs no torch.distributed at all, so the same
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
        device_mesh=None,
    ):
        self.config = config
        self.device = torch.device(device)
        self._groups = groups
        self._coords = coords
        self.global_rank = global_rank
        self.device_mesh = device_mesh
        self.stats = CommStats()

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> ParallelMesh:
        """A one-rank mesh: no process groups, every collective is a no-op."""
        cfg = ParallelConfig()
        dims = (*MESH_DIMS, "sp")
        return cls(cfg, torch.device(device), dict.fromkeys(dims), dict.fromkeys(dims, 0))

    @classmethod
    def build(cls, config: ParallelConfig, device: str | torch.device) -> ParallelMesh:
        """Create the mesh over the default process group (which must be initialised)."""
        from torch.distributed.device_mesh import init_device_mesh

        device = torch.device(device)
        if config.world_size == 1 and not dist.is_initialized():
            return cls.single(device)
        device_mesh = init_device_mesh(device.type, config.shape, mesh_dim_names=MESH_DIMS)
        groups: dict[str, dist.ProcessGroup | None] = {}
        coords: dict[str, int] = {}
        for name in MESH_DIMS:
            coords[name] = device_mesh.get_local_rank(name)
            groups[name] = device_mesh.get_group(name) if getattr(config, name) > 1 else None
        # "sp": ring x ulysses flattened (ring-major), the group a token sequence is split over.
        coords["sp"] = coords["ring"] * config.ulysses + coords["ulysses"]
        groups["sp"] = None
        if config.sp_degree > 1:
            layout = device_mesh.mesh.reshape(config.cfg, config.pp, config.sp_degree)
            for c in range(config.cfg):
                for p in range(config.pp):
                    ranks = layout[c, p].tolist()
                    group = dist.new_group(ranks)  # every rank creates every group, same order
                    if dist.get_rank() in ranks:
                        groups["sp"] = group
        return cls(config, device, groups, coords, dist.get_rank(), device_mesh)

    # -- coordinates -------------------------------------------------------------------------
    def group(self, dim: str) -> dist.ProcessGroup | None:
        return self._groups[dim]

    def size(self, dim: str) -> int:
        """Degree of ``dim``: one of cfg, pp, ring, ulysses, or sp (= ring x ulysses)."""
        return self.config.sp_degree if dim == "sp" else getattr(self.config, dim)

    def rank(self, dim: str) -> int:
        return self._coords[dim]

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def is_first_stage(self) -> bool:
        return self.rank("pp") == 0

    def is_last_stage(self) -> bool:
        return self.rank("pp") == self.size("pp") - 1

    def __repr__(self) -> str:
        coords = ", ".join(f"{d}={self._coords[d]}/{getattr(self.config, d)}" for d in MESH_DIMS)
        return f"ParallelMesh(rank={self.global_rank}, {coords}, device={self.device})"
