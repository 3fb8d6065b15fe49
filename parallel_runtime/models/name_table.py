"""Renaming a checkpoint's tensor names through a table of (original, diffusers) name pieces."""

from __future__ import annotations

from collections.abc import Sequence


def renamed(name: str, renames: Sequence[tuple[str, str]], to_original: bool = False) -> str:
    """``name`` in diffusers' names (or back, with ``to_original``): a piece starting with "." is replaced
    wherever it stands, any other only as the name's prefix; the pieces apply in the table's order."""
    for original, diffusers in renames:
        old, new = (diffusers, original) if to_original else (original, diffusers)
        if old.startswith("."):
            name = name.replace(old, new)
        elif name.startswith(old):
            name = new + name[len(old) :]
    return name
