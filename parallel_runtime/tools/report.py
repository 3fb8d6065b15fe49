"""Printing benchmark results as a table and writing them as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def emit(results: dict[str, Any], title: str, json_path: str | None) -> None:
    print(table(results, title))
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(results, indent=2, default=str))
        print(f"\nwrote {json_path}")
