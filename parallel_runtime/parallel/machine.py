"""The machine the workers run on: its devices, their free memory and which pairs reach each other
directly (NVLink / PCIe P2P), as the layout planner sees it.

``MachineInfo.detect()`` reads torch.cuda (device count, memory, ``can_device_access_peer``) and
degrades to CPU ranks when no GPU is visible; ``MachineInfo.cpu`` and ``MachineInfo.uniform``
describe machines for planning and tests. CPU ranks share the host's available memory, or have the memory
per rank that ``$DIT_PARALLEL_CPU_MEMORY`` states (e.g. ``512MiB``): a CPU stand-in for smaller devices.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

from ..errors import ConfigError
from .config import parse_devices

GiB = 1024**3
CPU_MEMORY_ENV = "DIT_PARALLEL_CPU_MEMORY"  # memory per CPU rank the layout planner assumes (bytes, or 512MiB, 2GB)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1024, "mib": 1024**2, "gib": GiB}


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device a worker can run on."""

    name: str  # "cuda:N" or "cpu"
    label: str  # e.g. "NVIDIA GeForce RTX 4090"
    total_bytes: int
    free_bytes: int


@dataclasses.dataclass(frozen=True)
class MachineInfo:
    """The devices offered to the workers and which pairs reach each other directly."""

    devices: tuple[DeviceInfo, ...]
    p2p: tuple[tuple[bool, ...], ...]  # p2p[i][j]: device i can read device j's memory directly

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n == 0:
            raise ConfigError(
                "the machine description has no devices",
                "the runtime starts one worker per device",
                "describe at least one device, or use MachineInfo.cpu(ranks) for CPU workers",
            )
        if len(self.p2p) != n or any(len(row) != n for row in self.p2p):
            raise ConfigError(
                f"the peer-access matrix is not {n} x {n}",
                "p2p[i][j] must say for every pair of devices whether i reaches j directly",
                "give one row of booleans per device",
            )

    @property
    def is_cpu(self) -> bool:
        return all(d.name == "cpu" for d in self.devices)

    def peer(self, i: int, j: int) -> bool:
        """Direct access both ways (a link an all-to-all can use at full speed)."""
        return i == j or (self.p2p[i][j] and self.p2p[j][i])

    def clique(self, indices: Sequence[int]) -> bool:
        return all(self.peer(a, b) for a in indices for b in indices)

    def describe(self) -> str:
        lines = [
            f"{d.name} {d.label}: {format_bytes(d.free_bytes)} of {format_bytes(d.total_bytes)} free"
            for d in self.devices
        ]
        return "; ".join(lines)

    @classmethod
    def cpu(cls, ranks: int, memory_bytes: int | None = None) -> MachineInfo:
        """``ranks`` CPU worker processes sharing the machine's memory (all "peers": shared memory)."""
        if memory_bytes is None:
            memory_bytes = _available_ram()
        share = memory_bytes // max(ranks, 1)
        devs = tuple(DeviceInfo("cpu", "CPU", share, share) for _ in range(ranks))
        return cls(devs, tuple(tuple(True for _ in range(ranks)) for _ in range(ranks)))

    @classmethod
    def uniform(cls, count: int, memory_gib: float, p2p: bool, label: str = "GPU") -> MachineInfo:
        """A described machine of ``count`` identical GPUs, all with or all without peer access."""
        mem = int(memory_gib * GiB)
        devs = tuple(DeviceInfo(f"cuda:{i}", label, mem, mem) for i in range(count))
        return cls(devs, tuple(tuple(p2p or i == j for j in range(count)) for i in range(count)))

    @classmethod
    def detect(cls, devices: str | Sequence[str] | None = None) -> MachineInfo:
        """Read this machine: the listed devices (``"cuda:0,cuda:2"``, ``"cpu:2"``) or, with
        ``None`` / ``"all"``, every visible GPU. Without a GPU it describes one CPU rank.

        Free memory comes from NVML when available (no CUDA context is created on the GPUs),
        else from ``torch.cuda.mem_get_info``."""
        try:
            import torch

            cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # torch missing or broken CUDA driver: plan for CPU ranks
            cuda_count = 0
        if devices is None or (isinstance(devices, str) and devices.strip().lower() in ("", "all")):
            if cuda_count == 0:
                return cls.cpu(1, cpu_memory_override(1))
            names = [f"cuda:{i}" for i in range(cuda_count)]
        else:
            names = parse_devices(devices)
        if all(n == "cpu" for n in names):
            return cls.cpu(len(names), cpu_memory_override(len(names)))
        ids = [int(n.split(":")[1]) for n in names]
        bad = [f"cuda:{i}" for i in ids if i >= cuda_count]
        if bad:
            raise ConfigError(
                f"device(s) {', '.join(bad)} requested but {cuda_count} CUDA GPU(s) are visible",
                "a worker can only use a GPU this process can see (CUDA_VISIBLE_DEVICES applies)",
                "list visible GPUs only, or use CPU ranks such as 'cpu:2'",
            )
        return cls(tuple(_cuda_device(i) for i in ids), tuple(tuple(_can_access(i, j) for j in ids) for i in ids))


def _cuda_device(index: int) -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    total = int(props.total_memory)
    try:
        free = total - int(torch.cuda.device_memory_used(index))  # NVML: no context on the GPU
    except Exception:
        free, total = (int(v) for v in torch.cuda.mem_get_info(index))
    return DeviceInfo(f"cuda:{index}", props.name, total, max(free, 0))


def _can_access(i: int, j: int) -> bool:
    if i == j:
        return True
    import torch

    try:
        return bool(torch.cuda.can_device_access_peer(i, j))
    except Exception:
        return False


def format_bytes(n: float) -> str:
    """1.5 GiB / 640.0 MiB / 12.0 KiB."""
    for unit, size in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size or unit == "KiB":
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def cpu_memory_override(ranks: int) -> int | None:
    """The memory of ``ranks`` CPU ranks as ``$DIT_PARALLEL_CPU_MEMORY`` states it per rank, or None (unset):
    planning CPU ranks as devices of that size shows on CPU what the auto layout does with smaller GPUs."""
    text = os.environ.get(CPU_MEMORY_ENV, "").strip()
    if not text:
        return None
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)", text)
    unit = _UNITS.get(match.group(2).lower(), 0) if match else 0
    per_rank = int(float(match.group(1)) * unit) if match else 0
    if per_rank <= 0:
        raise ConfigError(
            f"{CPU_MEMORY_ENV}={text!r}",
            "it states the memory of each CPU rank for the layout planner, a positive size",
            f"give bytes or a size such as 512MiB or 2GB, or unset {CPU_MEMORY_ENV} to use the host's free memory",
        )
    return per_rank * ranks


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * GiB
