"""The bridge's capability checks with stand-ins for ComfyUI's modules: each piece of ComfyUI it uses is looked up
when used; a ComfyUI without it (an update renamed it) costs that feature with one warning, never the node; the
classic progress bar where it is there, else the public ``Execution.set_progress``, each with the preview picture
in the form it takes. (The real ComfyUI without these pieces: tests/comfyui/test_comfyui_without_hooks.py.)"""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch
from pack_import import load_pack

from parallel_runtime.errors import JobCancelled

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402


class Interrupt(Exception):
    """Stands in for comfy.model_management.InterruptProcessingException."""


class FakeComfy:
    """comfy (with utils, cli_args, model_management) and comfy_api.v0_0_2, each piece removable."""

    def __init__(self, monkeypatch):
        self.bars: list[tuple] = []
        self.public: list[tuple] = []
        self.interrupt = False
        comfy = types.ModuleType("comfy")
        comfy.__path__ = []
        utils = types.ModuleType("comfy.utils")
        fake = self

        class ProgressBar:
            def __init__(self, total):
                self.total = total

            def update_absolute(self, value, total=None, preview=None):
                fake.bars.append((value, total, preview))

        utils.ProgressBar = ProgressBar
        cli = types.ModuleType("comfy.cli_args")
        cli.args = types.SimpleNamespace(preview_method=types.SimpleNamespace(value="auto"), preview_size=384)
        mm = types.ModuleType("comfy.model_management")
        mm.processing_interrupted = lambda: fake.interrupt
        mm.InterruptProcessingException = Interrupt

        class Execution:
            def set_progress(self, value, max_value, node_id=None, preview_image=None):
                fake.public.append((value, max_value, preview_image))

        api = types.ModuleType("comfy_api.v0_0_2")
        api.io = types.SimpleNamespace(ComfyNode=object, Schema=object, NodeOutput=object, Custom=object)
        api.ComfyAPISync = lambda: types.SimpleNamespace(execution=Execution())
        self.modules = {
            "comfy": comfy,
            "comfy.utils": utils,
            "comfy.cli_args": cli,
            "comfy.model_management": mm,
            "comfy_api": types.ModuleType("comfy_api"),
            "comfy_api.v0_0_2": api,
        }
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def comfy(monkeypatch):
    return FakeComfy(monkeypatch)


def picture() -> torch.Tensor:
    return torch.arange(2 * 3 * 3, dtype=torch.uint8).reshape(2, 3, 3)


def test_the_classic_bar_gets_the_preview_as_comfyui_previews_are(comfy):
    bridge = ComfyBridge()
    bridge.progress_bar(4).update_absolute(1, 4, picture())
    ((value, total, preview),) = comfy.bars
    kind, image, size = preview
    assert (value, total, kind, size) == (1, 4, "JPEG", 384)  # ComfyUI's --preview-size
    assert image.size == (3, 2) and image.getpixel((1, 0)) == (3, 4, 5)
    assert comfy.public == [] and bridge.lost() == {}


def test_without_the_classic_bar_progress_goes_through_the_public_api_with_one_warning(comfy, caplog):
    del comfy.modules["comfy.utils"].ProgressBar  # renamed by an update
    bridge = ComfyBridge()
    with caplog.at_level(logging.WARNING, logger="dit_parallel.bridge"):
        for step in (1, 2):
            bridge.progress_bar(2).update_absolute(step, 2, picture())
    assert [(v, m) for v, m, _ in comfy.public] == [(1, 2), (2, 2)]
    assert comfy.public[0][2].size == (3, 2)  # a PIL image, as set_progress takes it
    warnings = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
    assert len(warnings) == 1 and "comfy.utils.ProgressBar" in warnings[0]
    assert set(bridge.lost()) == {"the classic progress bar"}


def test_previews_off_when_comfyui_says_none(comfy):
    comfy.modules["comfy.cli_args"].args.preview_method = types.SimpleNamespace(value="none")
    ComfyBridge().progress_bar(2).update_absolute(1, 2, picture())
    assert comfy.bars == [(1, 2, None)]


def test_without_any_progress_api_the_node_still_runs(comfy):
    del comfy.modules["comfy.utils"].ProgressBar
    del comfy.modules["comfy_api.v0_0_2"].ComfyAPISync
    bridge = ComfyBridge()
    bridge.progress_bar(2).update_absolute(1, 2, picture())  # nothing to show it on: no error
    assert comfy.bars == [] and comfy.public == []
    assert "progress and previews" in bridge.lost()


def test_interrupt_read_and_raised_as_comfyuis_and_lost_without_a_warning_storm(comfy, caplog):
    bridge = ComfyBridge()
    assert bridge.interrupted() is False
    comfy.interrupt = True
    assert bridge.interrupted() is True
    with pytest.raises(Interrupt) as err:
        bridge.raise_interrupted(JobCancelled("stopped"))
    assert isinstance(err.value.__cause__, JobCancelled) and bridge.is_interrupt(err.value)
    del comfy.modules["comfy.model_management"].processing_interrupted
    del comfy.modules["comfy.model_management"].InterruptProcessingException
    with caplog.at_level(logging.WARNING, logger="dit_parallel.bridge"):
        assert [bridge.interrupted() for _ in range(50)] == [False] * 50  # polled every 50 ms while a job runs
        with pytest.raises(JobCancelled):
            bridge.raise_interrupted(JobCancelled("stopped"))  # ends as an error instead of "interrupted"
    assert len([r for r in caplog.records if "lacks" in r.getMessage()]) == 2
    assert set(bridge.lost()) == {"Cancel during a job", "reporting Cancel"}


def test_where_the_sync_api_lacks_execution_the_async_one_is_awaited_in_the_nodes_context(comfy):
    """ComfyUI 0.3.64 builds ComfyAPISync without ``execution``; ComfyAPI.Execution's set_progress is a
    coroutine that finds the running node through a context variable."""
    import contextvars

    node = contextvars.ContextVar("node", default=None)
    seen = []

    class Execution:
        async def set_progress(self, value, max_value, node_id=None, preview_image=None):
            seen.append((value, max_value, node.get(), preview_image.size))

    api = comfy.modules["comfy_api.v0_0_2"]
    api.ComfyAPISync = lambda: types.SimpleNamespace()  # no execution
    api.ComfyAPI = types.SimpleNamespace(Execution=Execution)
    del comfy.modules["comfy.utils"].ProgressBar
    node.set("7")
    ComfyBridge().progress_bar(3).update_absolute(2, 3, picture())
    assert seen == [(2, 3, "7", (3, 2))]
