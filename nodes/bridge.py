"""The one door to ComfyUI: folders, progress and previews, interrupt, memory, server events, the node API.

This is the only place of the pack that touches ComfyUI (``comfy_api``, ``comfy.*``, ``folder_paths``,
``server``), always lazily and through ``Hooks``: a piece an update removed or renamed costs its feature, with
one warning, never the graph. It prefers ComfyUI's versioned public API (``comfy_api``) where that works in
the running version. Without ComfyUI every method degrades to a no-op (or a plain default), so the nodes run
in tests and scripts; tests replace the bridge with a recording double that has the same methods (``Bridge``).

Call the methods from the node's executing thread: ComfyUI finds the running node through a context
variable, and its progress hook raises on interrupt in the calling thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .hooks import Hooks
from .memory_hooks import MemoryHooks

log = logging.getLogger("dit_parallel.bridge")

STATUS_EVENT = "dit_parallel.status"
"""Name of the PromptServer event that feeds the web status panel."""

SHIPPED_TOKENIZERS = "comfy_text_encoders"
"""A ``folder_paths`` kind of our own: the folder where ComfyUI ships its tokenizers
(``comfy/text_encoders``, e.g. ``qwen25_tokenizer``)."""

PUBLIC_API = ("comfy_api.v0_0_2", "comfy_api.latest")  # the versioned API first: what ComfyUI keeps stable
PROBE_ID = "DiTParallelComboProbe"  # registered for a moment, to ask ComfyUI's validator (never saved)
DEFAULT_PREVIEW_SIZE = 512  # ComfyUI's --preview-size default
NO_PREVIEWS = "none"  # ComfyUI's --preview-method none


class ProgressBar(Protocol):
    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        """Move the node's bar to ``value`` of ``total``; ``preview``: uint8 RGB [H, W, 3] (or None)."""


class Bridge(Protocol):
    """What the nodes need from ComfyUI."""

    def available(self) -> bool: ...
    def folder_paths(self, kind: str) -> list[str]: ...
    def progress_bar(self, total: int) -> ProgressBar: ...
    def interrupted(self) -> bool: ...
    def raise_interrupted(self, cause: BaseException) -> None: ...
    def is_interrupt(self, exc: BaseException) -> bool: ...
    def free_memory_for(self, devices: Sequence[str]) -> None: ...
    def send_status(self, payload: dict[str, Any]) -> None: ...
    def on_free_requested(self, callback: Callable[[], None]) -> None: ...
    def on_memory_needed(self, callback: Callable[[str], None]) -> None: ...


class _NullBar:
    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        return None


def _picture(rgb: Any) -> Any:
    """A uint8 RGB tensor [H, W, 3] as a PIL image (ComfyUI's previews are PIL images)."""
    from PIL import Image

    return Image.fromarray(rgb.contiguous().numpy(), "RGB")


class _ClassicBar:
    """ComfyUI's ``comfy.utils.ProgressBar``: its hook sends the page's ``progress`` message and preview (and,
    in 0.3.64, feeds the same progress registry ``Execution.set_progress`` feeds), and raises on interrupt."""

    def __init__(self, bar: Any, preview_size: int, previews: bool):
        self.bar, self.preview_size, self.previews = bar, preview_size, previews

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        image = ("JPEG", _picture(preview), self.preview_size) if preview is not None and self.previews else None
        self.bar.update_absolute(value, total, image)


class _PublicBar:
    """ComfyUI's public ``Execution.set_progress`` (comfy_api): the node's progress and its preview image."""

    def __init__(self, execution: Any, total: int, previews: bool):
        self.execution, self.total, self.previews = execution, total, previews

    def update_absolute(self, value: int, total: int | None = None, preview: Any = None) -> None:
        self.total = total or self.total
        image = _picture(preview) if preview is not None and self.previews else None
        self.execution.set_progress(min(value, self.total), self.total, preview_image=image)


class _AwaitedExecution:
    """An async ``Execution`` called from the node's (synchronous) thread: each call runs on a loop of its own in
    a helper thread, with this thread's context variables (as comfy_api's own sync wrapper does)."""

    def __init__(self, execution: Any):
        self.execution = execution

    def set_progress(self, value: float, max_value: float, preview_image: Any = None) -> None:
        context = contextvars.copy_context()
        call = self.execution.set_progress(value, max_value, preview_image=preview_image)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dit-parallel-progress") as pool:
            pool.submit(context.run, asyncio.run, call).result(timeout=60)


class ComfyBridge(MemoryHooks):
    """The real bridge. Each feature looks its ComfyUI piece up when used (``Hooks``)."""

    def __init__(self, hooks: Hooks | None = None) -> None:
        super().__init__(hooks or Hooks())

    def available(self) -> bool:
        return self.hooks.comfy_running()

    def lost(self) -> dict[str, str]:
        """The features the running ComfyUI did not serve (what it lacks, what happens instead)."""
        return self.hooks.lost()

    # -- the node API ------------------------------------------------------------------------------
    def public_api(self) -> Any | None:
        """``comfy_api``'s versioned public API module (``io``, ``ComfyExtension``, ...), or None."""
        import importlib

        if not self.available():
            return None
        for name in PUBLIC_API:
            try:
                api = importlib.import_module(name)
            except Exception:  # an older ComfyUI: no such version
                continue
            if all(hasattr(getattr(api, "io", None), n) for n in ("ComfyNode", "Schema", "NodeOutput", "Custom")):
                return api
        self.hooks.lose("ComfyUI's public node API", f"{' or '.join(PUBLIC_API)} with io.ComfyNode", "classic nodes")
        return None

    def validates_public_combos(self, io: Any) -> bool | None:
        """Whether the running ComfyUI's prompt validation refuses an unknown value of a public-API combo, asked
        of ComfyUI itself: ``execution.validate_inputs`` on a one-node prompt, with a probe node registered for
        the question. None when it cannot be asked (a ComfyUI whose validator this code does not know)."""
        validate = self.hooks.find("execution", "validate_inputs", "choosing the node form", "the public form")
        mappings = self.hooks.find("nodes", "NODE_CLASS_MAPPINGS", "choosing the node form", "the public form", False)
        if not isinstance(mappings, dict) or not asyncio.iscoroutinefunction(validate):
            return None

        class Probe(io.ComfyNode):
            @classmethod
            def define_schema(cls) -> Any:
                return io.Schema(node_id=PROBE_ID, inputs=[io.Combo.Input("choice", options=["a", "b"])], outputs=[])

            @classmethod
            def execute(cls, choice: str) -> Any:
                return io.NodeOutput()

        mappings[PROBE_ID] = Probe
        try:
            prompt = {"1": {"class_type": PROBE_ID, "inputs": {"choice": "not-a-choice"}}}
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # ComfyUI imports packs inside its running loop
                answer = pool.submit(asyncio.run, validate("dit-parallel-probe", prompt, "1", {})).result(timeout=30)
            return not answer[0]
        except Exception as exc:
            log.info("dit-parallel: could not ask ComfyUI's validator about public-API combos: %s", exc)
            return None
        finally:
            mappings.pop(PROBE_ID, None)

    # -- model folders -----------------------------------------------------------------------------
    def folder_paths(self, kind: str) -> list[str]:
        """ComfyUI's search folders for ``kind`` ("diffusers", "diffusion_models"; SHIPPED_TOKENIZERS:
        ComfyUI's tokenizer folder); without ComfyUI: $DIT_PARALLEL_MODELS/<kind> when that variable is set."""
        if kind == SHIPPED_TOKENIZERS:
            comfy = self.hooks.module("comfy", "ComfyUI's own tokenizers", "text-encoder files need a tokenizer folder")
            roots = [os.path.join(p, "text_encoders") for p in getattr(comfy, "__path__", [])]
            return [p for p in roots if os.path.isdir(p)]
        if self.available():
            lookup = self.hooks.find(
                "folder_paths",
                "get_folder_paths",
                "model folder lookup",
                "models are read from $DIT_PARALLEL_MODELS/<kind> only",
            )
            if lookup is not None:
                try:
                    return [p for p in lookup(kind) if os.path.isdir(p)]
                except Exception as exc:
                    log.warning("folder_paths.get_folder_paths(%r) failed: %s", kind, exc)
                    return []
        root = os.environ.get("DIT_PARALLEL_MODELS")
        return [os.path.join(root, kind)] if root and os.path.isdir(os.path.join(root, kind)) else []

    # -- progress and previews ---------------------------------------------------------------------
    def progress_bar(self, total: int) -> ProgressBar:
        """The node's progress bar: ComfyUI's ProgressBar, which in this version reaches every listener (the
        page, API clients, the progress registry); where it is gone, the public ``Execution.set_progress``."""
        if not self.available():
            return _NullBar()
        previews = self._previews_on()
        bar = self.hooks.find(
            "comfy.utils", "ProgressBar", "the classic progress bar", "progress goes through comfy_api's set_progress"
        )
        if bar is not None:
            return _ClassicBar(bar(total), self._preview_size(), previews)
        execution = self._public_execution()
        if execution is not None:
            return _PublicBar(execution, total, previews)
        self.hooks.lose("progress and previews", "a progress API", "the node shows no progress bar or preview")
        return _NullBar()

    def _public_execution(self) -> Any | None:
        """comfy_api's ``Execution`` as its documented synchronous form (``ComfyAPISync().execution``); where that
        is broken (ComfyUI 0.3.64 builds the stub without ``execution``), the async ``ComfyAPI.Execution``
        awaited on a loop of its own, in this thread's context (ComfyUI finds the node through it)."""
        api = self.public_api()
        sync = getattr(api, "ComfyAPISync", None)
        try:
            execution = sync().execution if sync is not None else None
        except Exception:
            execution = None
        if callable(getattr(execution, "set_progress", None)):
            return execution
        inner = getattr(getattr(api, "ComfyAPI", None), "Execution", None)
        if inner is not None and asyncio.iscoroutinefunction(getattr(inner, "set_progress", None)):
            return _AwaitedExecution(inner())
        self.hooks.lose("public progress", "comfy_api's Execution.set_progress", "no progress bar or preview")
        return None

    def _previews_on(self) -> bool:
        method = self.hooks.find(
            "comfy.cli_args", "args.preview_method", "the preview switch", "previews are always on", call=False
        )
        return str(getattr(method, "value", method)) != NO_PREVIEWS

    def _preview_size(self) -> int:
        size = self.hooks.find(
            "comfy.cli_args",
            "args.preview_size",
            "the preview size",
            f"previews at most {DEFAULT_PREVIEW_SIZE} px",
            call=False,
        )
        return int(size) if isinstance(size, int) and size > 0 else DEFAULT_PREVIEW_SIZE

    # -- interrupt -----------------------------------------------------------------------------------
    def interrupted(self) -> bool:
        """Whether the user pressed Cancel (reads ComfyUI's flag without clearing it: ComfyUI clears it when
        the next prompt starts)."""
        if not self.available():
            return False
        flag = self.hooks.find(
            "comfy.model_management",
            "processing_interrupted",
            "Cancel during a job",
            "Cancel stops the graph at the next node, not the running job",
        )
        return bool(flag is not None and flag())

    def _interrupt_class(self) -> type | None:
        if not self.available():
            return None
        cls = self.hooks.find(
            "comfy.model_management",
            "InterruptProcessingException",
            "reporting Cancel",
            "a cancelled job ends as an error instead of 'interrupted'",
        )
        return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None

    def is_interrupt(self, exc: BaseException) -> bool:
        """Whether ``exc`` is ComfyUI's interrupt (its progress hook raises it on Cancel)."""
        cls = self._interrupt_class()
        return cls is not None and isinstance(exc, cls)

    def raise_interrupted(self, cause: BaseException) -> None:
        """End the node the way ComfyUI expects after a cancel (its InterruptProcessingException); without
        ComfyUI re-raise ``cause``."""
        cls = self._interrupt_class()
        if cls is None:
            raise cause
        if isinstance(cause, cls):
            raise cause
        raise cls() from cause

    # -- server events -------------------------------------------------------------------------------
    def _server(self, feature: str, instead: str) -> Any | None:
        return self.hooks.find("server", "PromptServer.instance", feature, instead, call=False)

    def send_status(self, payload: dict[str, Any]) -> None:
        if not self.available():
            return
        instance = self._server("the status panel's updates", "the DiT Parallel panel shows no live state")
        send = getattr(instance, "send_sync", None)
        if callable(send):
            send(STATUS_EVENT, payload)

    def add_routes(self, snapshot: Callable[[], dict[str, Any]], unload: Callable[[], None]) -> None:
        """GET /dit_parallel/status (the panel's first view) and POST /dit_parallel/unload."""
        if not self.available():
            return
        instance = self._server("the status panel's routes", "the DiT Parallel panel cannot load or unload")
        routes = getattr(instance, "routes", None)
        if routes is None:
            return
        from aiohttp import web

        @routes.get("/dit_parallel/status")
        async def _status(request: Any) -> Any:
            return web.json_response({**snapshot(), "lost": self.lost()})

        @routes.post("/dit_parallel/unload")
        async def _unload(request: Any) -> Any:
            import asyncio

            await asyncio.get_running_loop().run_in_executor(None, unload)  # closing waits for workers
            return web.json_response({**snapshot(), "lost": self.lost()})
