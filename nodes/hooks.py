"""Capability checks for the pieces of ComfyUI the pack reaches: each is looked up by name when it is used,
and when the running ComfyUI lacks it (an update renamed or removed it) the feature that needs it degrades
with one warning saying what is lost, instead of failing the graph.

Without ComfyUI at all (tests, scripts, the CLI) nothing is "lost": every feature is off, said once at info
level. ``Hooks.lost()`` lists what a running ComfyUI did not offer, for the log, the status panel and tests.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from typing import Any

log = logging.getLogger("dit_parallel.bridge")

MISSING = object()


class Hooks:
    """Looks up ComfyUI's modules and attributes for named features; warns once per feature it cannot serve."""

    def __init__(self) -> None:
        self._lost: dict[str, str] = {}  # feature -> what is missing and what happens instead
        self._lock = threading.Lock()
        self._comfy: bool | None = None

    def comfy_running(self) -> bool:
        """Whether this process runs ComfyUI (its ``comfy`` package is imported or importable)."""
        if self._comfy is None:
            import sys

            try:
                self._comfy = "comfy" in sys.modules or importlib.util.find_spec("comfy") is not None
            except (ImportError, ValueError):
                self._comfy = False
        return self._comfy

    def module(self, name: str, feature: str, instead: str) -> Any | None:
        """ComfyUI's module ``name``, or None (``feature`` is then marked lost: ``instead`` happens)."""
        try:
            return importlib.import_module(name)
        except Exception as exc:  # absent (tests, CLI), renamed, or broken by an update
            self.lose(feature, f"module {name} ({type(exc).__name__}: {exc})", instead)
            return None

    def find(self, module: str, path: str, feature: str, instead: str, call: bool = True) -> Any | None:
        """``module.path`` (dotted attributes), or None when any part is missing (or, with ``call``, not
        callable): ``feature`` is then marked lost."""
        obj = self.module(module, feature, instead)
        if obj is None:
            return None
        for part in path.split("."):
            obj = getattr(obj, part, MISSING)
            if obj is MISSING or obj is None:
                self.lose(feature, f"{module}.{path}", instead)
                return None
        if call and not callable(obj):
            self.lose(feature, f"{module}.{path} (not callable)", instead)
            return None
        return obj

    def lose(self, feature: str, missing: str, instead: str) -> None:
        """Note that ``feature`` cannot work as designed; the first time, say so (a warning inside ComfyUI)."""
        with self._lock:
            if feature in self._lost:
                return
            self._lost[feature] = f"{missing} is not available: {instead}"
        if self.comfy_running():
            log.warning("dit-parallel: %s needs ComfyUI's %s, which this ComfyUI lacks; %s", feature, missing, instead)
        else:
            log.info("dit-parallel without ComfyUI: %s off (%s)", feature, instead)

    def lost(self) -> dict[str, str]:
        """Every feature a running ComfyUI did not serve so far, with what happens instead."""
        with self._lock:
            return dict(self._lost) if self.comfy_running() else {}
