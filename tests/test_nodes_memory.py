"""Workers give their memory back when ComfyUI asks: POST /free (also while ComfyUI's prompt loop collects
garbage) and ComfyUI's own models needing a GPU; nothing on every unload."""

from __future__ import annotations

import sys
import threading

import torch
from node_helpers import RecordingBridge  # tests/ helpers
from pack_import import load_pack

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402


class FakeComfy:
    """Stand-ins for comfy.model_management and server.PromptServer with the calls ComfyUI's
    prompt loop makes (set_flag from POST /free, unload_all_models, free_memory)."""

    def __init__(self, free_bytes: float):
        import types

        self.free_bytes = free_bytes
        self.mm = types.ModuleType("comfy.model_management")
        self.mm.unload_all_models = lambda: self.mm.free_memory(1e30, torch.device("cuda", 0))
        self.mm.free_memory = lambda memory_required, device, keep_loaded=(): []
        self.mm.get_free_memory = lambda device: self.free_bytes
        queue = types.SimpleNamespace(flags={})
        queue.set_flag = lambda name, data: queue.flags.__setitem__(name, data)
        self.server = types.ModuleType("server")
        self.server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(prompt_queue=queue))
        self.queue = queue

    def install(self, monkeypatch) -> None:
        import types

        comfy = types.ModuleType("comfy")
        comfy.model_management = self.mm
        monkeypatch.setitem(sys.modules, "comfy", comfy)
        monkeypatch.setitem(sys.modules, "comfy.model_management", self.mm)
        monkeypatch.setitem(sys.modules, "server", self.server)


def test_workers_are_freed_when_the_user_frees_memory_not_on_every_unload(monkeypatch):
    comfy = FakeComfy(free_bytes=0)
    comfy.install(monkeypatch)
    freed = []
    ComfyBridge().on_free_requested(lambda: freed.append("all"))
    comfy.mm.unload_all_models()  # after a prompt under --disable-smart-memory, or after an OOM
    assert freed == []
    comfy.queue.set_flag("unload_models", True)  # POST /free {"unload_models": true}
    comfy.mm.unload_all_models()  # ComfyUI's prompt loop, right after reading the flags
    assert freed == ["all"]
    comfy.mm.unload_all_models()
    assert freed == ["all"]
    comfy.queue.set_flag("free_memory", True)
    comfy.mm.unload_all_models()
    assert freed == ["all", "all"] and comfy.queue.flags == {"unload_models": True, "free_memory": True}


class PromptLoop:
    """ComfyUI 0.3.64's prompt queue and loop as far as freeing goes (execution.PromptQueue's get,
    set_flag and get_flags; main.py's prompt_worker): the queue wait does not look at the flags, and
    the loop reads them only after the wait returns, collecting garbage before it waits again."""

    def __init__(self, mm, wait_s: float):
        self.mm, self.wait_s = mm, wait_s
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.flags: dict = {}
        self.collecting, self.collected = threading.Event(), threading.Event()

    def set_flag(self, name, data):
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self):
        with self.mutex:
            flags, self.flags = self.flags, {}
            return flags

    def get(self, timeout):
        with self.not_empty:
            self.not_empty.wait(timeout=timeout)  # no prompt is ever queued here
            return None

    def after_a_prompt(self):
        """One turn of prompt_worker after a prompt: flags, gc.collect(), wait, flags."""
        for turn in range(2):
            flags = self.get_flags()
            if flags.get("unload_models", flags.get("free_memory", False)):
                self.mm.unload_all_models()
            if turn == 0:
                self.collecting.set()
                self.collected.wait(10)  # gc.collect() (seconds on a loaded host)
                self.get(self.wait_s)


def test_free_lands_while_comfyuis_prompt_loop_collects_garbage(monkeypatch):
    """POST /free between the loop's flag read and its next wait: the notify is lost, and ComfyUI
    alone would free nothing until the next prompt (or its 1000 s wait ends)."""
    comfy = FakeComfy(free_bytes=0)
    loop = PromptLoop(comfy.mm, wait_s=60.0)
    comfy.server.PromptServer.instance.prompt_queue = loop
    comfy.install(monkeypatch)
    freed = threading.Event()
    ComfyBridge().on_free_requested(freed.set)
    worker = threading.Thread(target=loop.after_a_prompt, daemon=True)
    worker.start()
    assert loop.collecting.wait(10)
    loop.set_flag("unload_models", True)  # the route's call, while the loop collects garbage
    loop.collected.set()
    assert freed.wait(10), "the free request waited for the next prompt"
    worker.join(10)
    assert not worker.is_alive() and loop.flags == {}


def test_workers_on_a_gpu_are_freed_when_comfyui_needs_its_memory(monkeypatch):
    comfy = FakeComfy(free_bytes=2e9)
    comfy.install(monkeypatch)
    needed = []
    ComfyBridge().on_memory_needed(needed.append)
    comfy.mm.free_memory(1e9, torch.device("cuda", 1))  # enough is free
    comfy.mm.free_memory(3e9, torch.device("cpu"))  # not a GPU
    comfy.mm.unload_all_models()  # "unload everything" (also what we ask before starting workers)
    assert needed == []
    comfy.mm.free_memory(3e9, torch.device("cuda", 1))  # ComfyUI's own model does not fit next to ours
    assert needed == ["cuda:1"]


def test_context_frees_only_the_pools_on_the_needed_gpu():
    class Pool:
        def __init__(self, devices):
            self.devices, self.closed = devices, False

        def close(self):
            self.closed = True

    pools = [Pool(["cuda:0", "cuda:1"]), Pool(["cuda:2", "cuda:3"])]
    registry = type("Registry", (), {"pools": lambda self: list(pools)})()
    ctx = NodeContext.create(registry=registry, bridge=RecordingBridge())
    ctx.status.pool_loaded("a", "m", "flux", ["cuda:0", "cuda:1"], "ulysses=2", "")
    ctx.status.pool_loaded("b", "m", "flux", ["cuda:2", "cuda:3"], "ulysses=2", "")
    ctx.unload_device("cuda:1")
    assert [p.closed for p in pools] == [True, False]
    assert [p["pool"] for p in ctx.status.snapshot()["pools"]] == ["b"]
