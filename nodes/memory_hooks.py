"""GPU memory between ComfyUI and the workers: ComfyUI's own models leave the GPUs before workers start there;
the workers leave when the user frees memory in ComfyUI, or when ComfyUI needs a GPU's memory for its models.

ComfyUI has no public API for any of this (0.3.64), so each piece reaches an internal (``comfy.model_management``'s
``free_memory`` / ``get_free_memory`` / ``unload_all_models``, the prompt queue's ``set_flag``) through ``Hooks``:
a ComfyUI without it loses that piece with one warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .hooks import Hooks

log = logging.getLogger("dit_parallel.bridge")

FREE_FLAGS = ("unload_models", "free_memory")  # what POST /free sets on ComfyUI's prompt queue
UNLOAD_EVERYTHING = 1e29  # ComfyUI's unload_all_models asks free_memory for 1e30 bytes
MM = "comfy.model_management"
FREE_BUTTON = "freeing the workers with ComfyUI's Unload models / Free model and node cache"
FREE_BUTTON_INSTEAD = "those buttons leave the workers running (use Parallel Runtime Unload or the panel's button)"


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


class MemoryHooks:
    """The memory half of the bridge (``ComfyBridge`` derives from it)."""

    def __init__(self, hooks: Hooks):
        self.hooks = hooks

    def free_memory_for(self, devices: Sequence[str]) -> None:
        """Unload ComfyUI's own models from the GPUs the workers are about to use."""
        cuda = [d for d in devices if d.startswith("cuda")]
        if not cuda or not self.hooks.comfy_running():
            return
        free = self.hooks.find(
            MM, "free_memory", "moving ComfyUI's models off the workers' GPUs", "they stay; the workers may run short"
        )
        if free is None:
            return
        import torch

        for name in dict.fromkeys(cuda):
            try:
                free(1e30, torch.device(name))
            except Exception as exc:
                log.warning("could not free ComfyUI models on %s: %s", name, exc)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def on_free_requested(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the user frees memory in ComfyUI: "Unload models" / "Free model and
        node cache" (POST /free with ``unload_models`` or ``free_memory``). ComfyUI's prompt loop reads
        those flags and then calls ``comfy.model_management.unload_all_models``; so the flags are noted
        as they are set and the callback runs in that call, in ComfyUI's prompt thread. ComfyUI also
        calls ``unload_all_models`` after every prompt under --disable-smart-memory and after an
        out-of-memory error in any node: the workers stay warm then."""
        if not self.hooks.comfy_running():
            return
        mm = self.hooks.module(MM, FREE_BUTTON, FREE_BUTTON_INSTEAD)
        queue = self.hooks.find("server", "PromptServer.instance.prompt_queue", FREE_BUTTON, FREE_BUTTON_INSTEAD, False)
        original_unload = self.hooks.find(MM, "unload_all_models", FREE_BUTTON, FREE_BUTTON_INSTEAD)
        original_set_flag = getattr(queue, "set_flag", None)
        if mm is None or queue is None or original_unload is None:
            return
        if not callable(original_set_flag):
            self.hooks.lose(FREE_BUTTON, "the prompt queue's set_flag", FREE_BUTTON_INSTEAD)
            return
        hook = getattr(queue, "_dit_parallel_free", None)
        if hook is None:
            hook = _FreeHook()

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
        if not self.hooks.comfy_running():
            return
        feature = "freeing the workers when ComfyUI needs their GPU for its own models"
        instead = "ComfyUI's models may run out of memory next to the workers (unload them by hand)"
        mm = self.hooks.module(MM, feature, instead)
        original = self.hooks.find(MM, "free_memory", feature, instead)
        free_now = self.hooks.find(MM, "get_free_memory", feature, instead)
        if mm is None or original is None or free_now is None:
            return
        callbacks = getattr(original, "_dit_parallel_callbacks", None)
        if callbacks is None:
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
