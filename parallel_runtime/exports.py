"""Light wing packages: a wing's ``__init__`` names its public API, imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, table: Mapping[str, Sequence[str]]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package`` whose public names live in its submodules
    (``table``: submodule -> names). A name's submodule is imported when the name is first used, so
    importing the package itself imports nothing heavy."""
    where = {name: module for module, names in table.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return sorted(where), __getattr__
