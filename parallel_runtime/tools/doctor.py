"""``python -m parallel_runtime doctor``: what this machine offers the runtime."""

from __future__ import annotations

import os
import shutil
from typing import Any


def collect() -> dict[str, Any]:
    """Torch version, devices and memory, backends, GPU peer access, free shared memory."""
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "distributed_available": dist.is_available(),
        "gloo_available": dist.is_available() and dist.is_gloo_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "devices": [],
        "peer_access": {},
    }
    try:
        import flash_attn  # noqa: F401

        info["flash_attn"] = True
    except Exception:
        info["flash_attn"] = False
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        for i in range(n):
            free, total = torch.cuda.mem_get_info(i)
            props = torch.cuda.get_device_properties(i)
            info["devices"].append(
                {"device": f"cuda:{i}", "name": props.name, "total_bytes": total, "free_bytes": free}
            )
        for i in range(n):
            for j in range(n):
                if i != j:
                    info["peer_access"][f"{i}->{j}"] = bool(torch.cuda.can_device_access_peer(i, j))
    mem = _meminfo()
    info["devices"].append(
        {"device": "cpu", "total_bytes": mem.get("MemTotal", 0), "free_bytes": mem.get("MemAvailable", 0)}
    )
    if os.path.isdir("/dev/shm"):
        usage = shutil.disk_usage("/dev/shm")
        info["shm_total_bytes"], info["shm_free_bytes"] = usage.total, usage.free
    return info


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def render(info: dict[str, Any]) -> str:
    lines = [
        f"torch {info['torch']}  (cpu cores: {info['cpu_count']})",
        f"torch.distributed: {'yes' if info['distributed_available'] else 'NO'}   "
        f"gloo: {'yes' if info['gloo_available'] else 'no'}   nccl: {'yes' if info['nccl_available'] else 'no'}   "
        f"flash-attn: {'yes' if info['flash_attn'] else 'no'}",
        "devices:",
    ]
    for d in info["devices"]:
        name = f" {d['name']}" if "name" in d else ""
        lines.append(f"  {d['device']:<8}{name}  total {_gib(d['total_bytes'])}, free {_gib(d['free_bytes'])}")
    if not info["cuda_available"]:
        lines.append("  (no CUDA GPU visible: CPU ranks only, e.g. --devices cpu:2)")
    if info["peer_access"]:
        lines.append("GPU peer-to-peer access:")
        for pair, ok in info["peer_access"].items():
            lines.append(f"  {pair}: {'yes' if ok else 'no'}")
    if "shm_free_bytes" in info:
        lines.append(
            f"shared memory (/dev/shm): {_gib(info['shm_free_bytes'])} free of {_gib(info['shm_total_bytes'])}"
        )
        if info["shm_free_bytes"] < 1 << 30:
            lines.append("  warning: less than 1 GiB free; in Docker start the container with --shm-size=8g")
    return "\n".join(lines)
