"""The one door to ComfyUI: folders, progress bar, previews, interrupt, memory, server events.

This is the only module of the pack that imports ComfyUI (``comfy.*``, ``folder_paths``,
``server``, ``latent_preview``), always lazily. Without ComfyUI every method degrades to a no-op
(or a plain default) and logs one line per feature, so the nodes run in tests and scripts.
Tests replace the bridge with a recording double that has the same methods (see ``Bridge``).

Call the methods from the node's executing thread: ComfyUI finds the running node through a
context variable, and its progress hook raises on interrupt in the calling thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("dit_parallel.bridge")

STATUS_EVENT = "dit_parallel.status"
"""Name of the PromptServer event that feeds the web status panel."""


class ProgressBar(Protocol):
    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None: ...


class Bridge(Protocol):
    """What the nodes need from ComfyUI."""

    def available(self) -> bool: ...
    def folder_paths(self, kind: str) -> list[str]: ...
    def progress_bar(self, total: int) -> ProgressBar: ...
    def preview_image(self, family: str, latent: Any) -> Any: ...
    def interrupted(self) -> bool: ...
    def raise_interrupted(self, cause: BaseException) -> None: ...
    def free_memory_for(self, devices: Sequence[str]) -> None: ...
    def send_status(self, payload: dict[str, Any]) -> None: ...
    def on_unload_models(self, callback: Callable[[], None]) -> None: ...


class _NullBar:
    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        return None


class ComfyBridge:
    """The real bridge. Each feature imports its ComfyUI module on first use."""

    _PREVIEW_FORMATS = {"flux": "Flux", "sd3": "SD3", "pixart": "SD15"}  # comfy.latent_formats classes

    def __init__(self) -> None:
        self._missing: set[str] = set()
        self._previewers: dict[str, Any] = {}

    # -- lazy imports ------------------------------------------------------------------------------
    def _module(self, name: str, feature: str) -> Any | None:
        import importlib

        try:
            return importlib.import_module(name)
        except Exception as exc:  # ComfyUI absent (tests, CLI) or a broken install
            if feature not in self._missing:
                self._missing.add(feature)
                log.info("ComfyUI module %r not available (%s): %s disabled", name, type(exc).__name__, feature)
            return None

    def available(self) -> bool:
        return self._module("comfy.model_management", "ComfyUI integration") is not None

    # -- model folders -----------------------------------------------------------------------------
    def folder_paths(self, kind: str) -> list[str]:
        """ComfyUI's search folders for ``kind`` ("diffusers", "diffusion_models"); without
        ComfyUI: $DIT_PARALLEL_MODELS/<kind> when that variable is set."""
        fp = self._module("folder_paths", "model folder lookup")
        if fp is not None:
            try:
                return [p for p in fp.get_folder_paths(kind) if os.path.isdir(p)]
            except Exception as exc:
                log.warning("folder_paths.get_folder_paths(%r) failed: %s", kind, exc)
                return []
        root = os.environ.get("DIT_PARALLEL_MODELS")
        return [os.path.join(root, kind)] if root and os.path.isdir(os.path.join(root, kind)) else []

    # -- progress and previews ---------------------------------------------------------------------
    def progress_bar(self, total: int) -> ProgressBar:
        utils = self._module("comfy.utils", "progress bar")
        return utils.ProgressBar(total) if utils is not None else _NullBar()

    def preview_image(self, family: str, latent: Any) -> Any:
        """ComfyUI's preview tuple for a raw VAE latent [B,C,H,W] (None when previews are off)."""
        previewer = self._previewer(family)
        if previewer is None:
            return None
        try:
            return previewer.decode_latent_to_preview_image("JPEG", self._format(family).process_in(latent.float()))
        except Exception as exc:
            log.warning("latent preview failed: %s", exc)
            return None

    def _format(self, family: str) -> Any:
        formats = self._module("comfy.latent_formats", "latent previews")
        return getattr(formats, self._PREVIEW_FORMATS.get(family, "SD15"))()

    def _previewer(self, family: str) -> Any | None:
        if family not in self._previewers:
            lp = self._module("latent_preview", "latent previews")
            previewer = None
            if lp is not None:
                try:
                    previewer = lp.get_previewer("cpu", self._format(family))
                except Exception as exc:
                    log.warning("no latent previewer for %s: %s", family, exc)
            self._previewers[family] = previewer
        return self._previewers[family]

    # -- interrupt -----------------------------------------------------------------------------------
    def interrupted(self) -> bool:
        """Whether the user pressed Cancel (reads ComfyUI's flag without clearing it)."""
        mm = self._module("comfy.model_management", "cancel")
        return bool(mm is not None and mm.processing_interrupted())

    def raise_interrupted(self, cause: BaseException) -> None:
        """End the node the way ComfyUI expects after a cancel (its InterruptProcessingException,
        which also clears the flag); without ComfyUI re-raise ``cause``."""
        mm = self._module("comfy.model_management", "cancel")
        if mm is not None:
            if isinstance(cause, mm.InterruptProcessingException):
                raise cause
            mm.throw_exception_if_processing_interrupted()
            raise mm.InterruptProcessingException() from cause
        raise cause

    # -- memory --------------------------------------------------------------------------------------
    def free_memory_for(self, devices: Sequence[str]) -> None:
        """Unload ComfyUI's own models from the GPUs the workers are about to use."""
        cuda = [d for d in devices if d.startswith("cuda")]
        if not cuda:
            return
        mm = self._module("comfy.model_management", "freeing ComfyUI's GPU memory")
        if mm is None:
            return
        import torch

        for name in dict.fromkeys(cuda):
            try:
                mm.free_memory(1e30, torch.device(name))
            except Exception as exc:
                log.warning("could not free ComfyUI models on %s: %s", name, exc)
        mm.soft_empty_cache()

    def on_unload_models(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` whenever ComfyUI unloads its models (the "Unload models" / "Free
        memory" buttons reach ``comfy.model_management.unload_all_models`` from its main loop).
        The wrapper is installed once, calls the original first, then every registered callback."""
        mm = self._module("comfy.model_management", "unload hook")
        if mm is None:
            return
        callbacks = getattr(mm.unload_all_models, "_dit_parallel_callbacks", None)
        if callbacks is None:
            original = mm.unload_all_models
            callbacks = []

            def unload_all_models(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                for cb in list(callbacks):
                    try:
                        cb()
                    except Exception:
                        log.exception("dit-parallel unload callback failed")
                return result

            unload_all_models._dit_parallel_callbacks = callbacks  # type: ignore[attr-defined]
            mm.unload_all_models = unload_all_models
        callbacks.append(callback)

    # -- server events -------------------------------------------------------------------------------
    def send_status(self, payload: dict[str, Any]) -> None:
        server = self._module("server", "status panel events")
        instance = getattr(getattr(server, "PromptServer", None), "instance", None)
        if instance is not None:
            instance.send_sync(STATUS_EVENT, payload)

    def add_routes(self, snapshot: Callable[[], dict[str, Any]], unload: Callable[[], None]) -> None:
        """GET /dit_parallel/status (the panel's first view) and POST /dit_parallel/unload."""
        server = self._module("server", "status panel routes")
        instance = getattr(getattr(server, "PromptServer", None), "instance", None)
        if instance is None:
            return
        from aiohttp import web

        @instance.routes.get("/dit_parallel/status")
        async def _status(request: Any) -> Any:
            return web.json_response(snapshot())

        @instance.routes.post("/dit_parallel/unload")
        async def _unload(request: Any) -> Any:
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, unload)  # closing waits for workers
            return web.json_response(snapshot())
