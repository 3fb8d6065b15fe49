"""ParallelConfig (named degrees of the device mesh) and device-list parsing/validation."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..errors import ConfigError

MESH_DIMS: tuple[str, ...] = ("cfg", "pp", "ring", "ulysses")
"""Mesh dimensions, outermost first. Ulysses is innermost so its all-to-all runs between
neighbouring ranks (the fastest links); CFG is outermost (one gather per step)."""


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Degrees of parallelism; their product is the number of ranks (world size)."""

    cfg: int = 1
    pp: int = 1
    ring: int = 1
    ulysses: int = 1

    def __post_init__(self) -> None:
        for name in MESH_DIMS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(
                    f"{name} degree is {value!r}",
                    "every parallel degree counts ranks and must be a whole number of at least 1",
                    f"set {name}=1 to disable {name} parallelism, or a larger integer to use it",
                )
        if self.cfg > 2:
            raise ConfigError(
                f"cfg degree is {self.cfg}",
                "classifier-free guidance has two branches (cond and uncond), so at most 2 ranks can split it",
                "use cfg=1 or cfg=2 and give the other ranks to ulysses, ring or pp",
            )

    @property
    def world_size(self) -> int:
        return self.cfg * self.pp * self.ring * self.ulysses

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in MESH_DIMS)

    @property
    def sp_degree(self) -> int:
        """Sequence-parallel degree (ulysses x ring)."""
        return self.ring * self.ulysses

    def describe(self) -> str:
        parts = [f"{d}={getattr(self, d)}" for d in MESH_DIMS if getattr(self, d) > 1]
        return " x ".join(parts) if parts else "single"

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


_CPU_RE = re.compile(r"^cpu(?::(\d+))?$")
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")


def parse_devices(spec: str | Sequence[str]) -> list[str]:
    """Parse a device list: "cuda:0,cuda:2", ["cuda:0", "cuda:1"], or "cpu:4" (four CPU ranks).

    Returns one device string per rank ("cpu" or "cuda:N"). Raises ConfigError on a bad entry.
    """
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip()]
    else:
        items = [str(s).strip() for s in spec]
    if not items:
        raise ConfigError(
            "no devices were given",
            "the runtime starts one worker process per device and needs at least one",
            'pass devices such as "cuda:0,cuda:1" or "cpu:2" (two CPU ranks)',
        )
    if not isinstance(spec, str) and all(i.lower() == "cpu" for i in items):
        return ["cpu"] * len(items)  # an already-parsed list: one entry per CPU rank
    devices: list[str] = []
    for item in items:
        low = item.lower()
        m = _CPU_RE.match(low)
        if m:
            if len(items) > 1:
                raise ConfigError(
                    f"device list {','.join(items)!r} mixes 'cpu' with other entries",
                    "CPU ranks are given as one entry 'cpu:N' meaning N CPU worker processes",
                    'use "cpu:N" alone, or list only cuda devices',
                )
            count = int(m.group(1) or 1)
            if count < 1:
                raise ConfigError(
                    f"device entry {item!r} asks for {count} CPU ranks",
                    "at least one worker is needed",
                    'use "cpu:1" or more',
                )
            return ["cpu"] * count
        m = _CUDA_RE.match(low)
        if m:
            devices.append(f"cuda:{int(m.group(1) or 0)}")
            continue
        raise ConfigError(
            f"unknown device {item!r}",
            "devices must be CUDA GPUs ('cuda:N') or CPU ranks ('cpu:N')",
            'write e.g. "cuda:0,cuda:1" or "cpu:2"',
        )
    seen: set[str] = set()
    for d in devices:
        if d in seen:
            raise ConfigError(
                f"device {d} is listed twice",
                "each worker process needs a GPU of its own; NCCL cannot run two ranks on one GPU",
                "list every GPU once, e.g. cuda:0,cuda:1",
            )
        seen.add(d)
    return devices


def validate_layout(devices: Sequence[str], config: ParallelConfig, visible_cuda: int | None = None) -> None:
    """Check that the degrees fit the devices and every GPU listed is visible. Raises ConfigError before
    any process starts."""
    if config.world_size != len(devices):
        raise ConfigError(
            f"layout {config.describe()} needs {config.world_size} ranks but {len(devices)} device(s) were given "
            f"({', '.join(devices)})",
            "the product cfg x pp x ring x ulysses must equal the number of worker processes (one per device)",
            f"give {config.world_size} devices, or change the degrees so that their product is {len(devices)}",
        )
    check_visible(devices, visible_cuda)


def check_visible(devices: Sequence[str], visible_cuda: int | None = None) -> None:
    """Every GPU in ``devices`` is one this process can see (``visible_cuda``: the count; None: ask torch)."""
    cuda = [d for d in devices if d.startswith("cuda")]
    if not cuda:
        return
    if visible_cuda is None:
        import torch

        visible_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [d for d in cuda if int(d.split(":")[1]) >= visible_cuda]
    if bad:
        raise ConfigError(
            f"device(s) {', '.join(bad)} requested but only {visible_cuda} CUDA GPU(s) are visible",
            "a worker can only use a GPU that this process can see (CUDA_VISIBLE_DEVICES applies)",
            f"list GPUs between cuda:0 and cuda:{max(visible_cuda - 1, 0)} or use CPU ranks ('cpu:N')"
            if visible_cuda
            else "no GPU is visible: use CPU ranks such as 'cpu:2'",
        )
