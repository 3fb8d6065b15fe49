"""Printing benchmark results as a table and writing them as JSON.

Every benchmark's result dict names what it ran and what its ratios divide by, in words:

- ``model``: the model config (family, blocks, hidden size, heads, tokens, channels; random or
  trained weights), e.g. "Flux-layout transformer, random fp32 weights: 2+2 blocks, hidden 512 (8 heads x
  64), 4096 image + 256 text tokens, 16 latent channels";
- ``baseline``: what a speedup divides by, e.g. "1 rank x 1 thread (models 1 GPU)".

:func:`emit` refuses a result without them. :func:`machine` adds what the figures ran on. Keys
beyond these are the benchmark's own (other work may add more to an existing benchmark's dict).
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

REQUIRED_KEYS = ("model", "baseline")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def table(results: dict[str, Any], title: str) -> str:
    flat: list[tuple[str, Any]] = []

    def walk(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat.append((prefix, obj))

    walk("", results)
    width = max((len(k) for k, _ in flat), default=10)
    lines = [title, "-" * (width + 20)]
    lines += [f"{k:<{width}}  {_fmt(v)}" for k, v in flat]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """What the figures ran on: CPUs, load at the start, torch version, GPU name if any."""
    import torch

    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def check_result(results: dict[str, Any]) -> None:
    """Raise if ``results`` does not name its model and baseline (the convention above)."""
    missing = [k for k in REQUIRED_KEYS if not isinstance(results.get(k), str) or not results[k]]
    if missing:
        raise ValueError(
            f"benchmark result lacks {', '.join(missing)}: every benchmark names the model config it ran "
            "('model') and what its speedups divide by ('baseline'), in words"
        )


def emit(results: dict[str, Any], title: str, json_path: str | None) -> None:
    check_result(results)
    results.setdefault("machine", machine())
    print(table(results, title))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(results, indent=2, default=str))
        print(f"\nwrote {json_path}")
