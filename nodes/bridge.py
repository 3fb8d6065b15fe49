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
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("dit_parallel.bridge")

STATUS_EVENT = "dit_parallel.status"
"""Name of the PromptServer event that feeds the web status panel."""

SHIPPED_TOKENIZERS = "comfy_text_encoders"
"""A ``folder_paths`` kind of our own: the folder where ComfyUI ships its tokenizers
(``comfy/text_encoders``, e.g. ``qwen25_tokenizer``)."""


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
    def on_free_requested(self, callback: Callable[[], None]) -> None: ...
    def on_memory_needed(self, callback: Callable[[str], None]) -> None: ...


FREE_FLAGS = ("unload_models", "free_memory")  # what POST /free sets on ComfyUI's prompt queue
UNLOAD_EVERYTHING = 1e29  # ComfyUI's unload_all_models asks free_memory for 1e30 bytes


class _FreeHook:
    def __init__(self) -> None:
        self.requested = threading.Event()
        self.callbacks: list[Callable[[], None]] = []


def _wake_until_read(queue: Any, name: str, period_s: float = 0.25, limit_s: float = 120.0) -> None:
    """Wake ComfyUI's prompt loop until it has read flag ``name``. The loop reads the flags only
    when its queue wait returns, and set_flag's notify is lost if it lands while the loop is
    between reading the flags and waiting again (main.py's prompt_worker runs gc.collect() there,
    seconds on a loaded host): the loop would then sleep until the next prompt or 1000 s."""
    mutex, woken = getattr(queue, "mutex", None), getattr(queue, "not_empty", None)
    if mutex is None or woken is None or not isinstance(getattr(queue, "flags", None), dict):
        return

    def nudge() -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            time.sleep(period_s)
            with mutex:
                if not queue.flags.get(name):
                    return  # read (get_flags resets them)
                woken.notify()  # a wait with no prompt queued returns None: the loop reads the flags

    threading.Thread(target=nudge, name="dit-parallel-free-wake", daemon=True).start()


def _run_callbacks(callbacks: Sequence[Callable[[], None]]) -> None:
    for cb in list(callbacks):
        try:
            cb()
        except Exception:
            log.exception("dit-parallel memory callback failed")


def _cuda_name(device: Any) -> str:
    index = getattr(device, "index", None)
    if index is None:
        import torch

        index = torch.cuda.current_device()
    return f"cuda:{index}"


class _NullBar:
    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        return None


class ComfyBridge:
    """The real bridge. Each feature imports its ComfyUI module on first use."""

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
        """ComfyUI's search folders for ``kind`` ("diffusers", "diffusion_models"; SHIPPED_TOKENIZERS:
        ComfyUI's tokenizer folder); without ComfyUI: $DIT_PARALLEL_MODELS/<kind> when that variable is set."""
        if kind == SHIPPED_TOKENIZERS:
            comfy = self._module("comfy", "ComfyUI's own tokenizers")
            roots = [os.path.join(p, "text_encoders") for p in getattr(comfy, "__path__", [])]
            return [p for p in roots if os.path.isdir(p)]
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
        from parallel_runtime.service.families import preview_format

        return getattr(formats, preview_format(family) or "SD15")()  # a comfy.latent_formats class

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

    def on_free_requested(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the user frees memory in ComfyUI: "Unload models" / "Free model and
        node cache" (POST /free with ``unload_models`` or ``free_memory``). ComfyUI's prompt loop reads
        those flags and then calls ``comfy.model_management.unload_all_models``; so the flags are noted
        as they are set and the callback runs in that call, in ComfyUI's prompt thread. ComfyUI also
        calls ``unload_all_models`` after every prompt under --disable-smart-memory and after an
        out-of-memory error in any node: the workers stay warm then."""
        mm = self._module("comfy.model_management", "freeing workers with ComfyUI's Free memory")
        server = self._module("server", "freeing workers with ComfyUI's Free memory")
        queue = getattr(getattr(getattr(server, "PromptServer", None), "instance", None), "prompt_queue", None)
        if mm is None or queue is None:
            return
        hook = getattr(queue, "_dit_parallel_free", None)
        if hook is None:
            hook = _FreeHook()
            original_set_flag, original_unload = queue.set_flag, mm.unload_all_models

            def set_flag(name: str, data: Any) -> Any:
                free = name in FREE_FLAGS and bool(data)
                if free:
                    hook.requested.set()
                result = original_set_flag(name, data)
                if free:
                    _wake_until_read(queue, name)
                return result

            def unload_all_models(*args: Any, **kwargs: Any) -> Any:
                result = original_unload(*args, **kwargs)
                if hook.requested.is_set():
                    hook.requested.clear()
                    _run_callbacks(hook.callbacks)
                return result

            queue.set_flag = set_flag
            mm.unload_all_models = unload_all_models
            queue._dit_parallel_free = hook
        hook.callbacks.append(callback)

    def on_memory_needed(self, callback: Callable[[str], None]) -> None:
        """Run ``callback(device)`` (e.g. "cuda:1") when ComfyUI tries to free memory for its own
        models on a GPU and, after unloading what it could, still has less free than it needs: the
        workers' memory there is in the way. ("Unload everything" requests, such as the one made
        before our workers start, do not count.)"""
        mm = self._module("comfy.model_management", "freeing workers when ComfyUI needs their GPU")
        if mm is None:
            return
        callbacks = getattr(mm.free_memory, "_dit_parallel_callbacks", None)
        if callbacks is None:
            original = mm.free_memory
            callbacks = []

            def free_memory(memory_required: float, device: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(memory_required, device, *args, **kwargs)
                if getattr(device, "type", None) == "cuda" and memory_required < UNLOAD_EVERYTHING:
                    try:
                        short = mm.get_free_memory(device) < memory_required
                    except Exception as exc:
                        log.warning("could not read free memory on %s: %s", device, exc)
                        short = False
                    if short:
                        name = _cuda_name(device)
                        _run_callbacks([lambda cb=cb: cb(name) for cb in callbacks])
                return result

            free_memory._dit_parallel_callbacks = callbacks  # type: ignore[attr-defined]
            mm.free_memory = free_memory
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
