"""The pack in a real ComfyUI whose internals it reaches are renamed away (tests/comfyui/without_hooks.py: the
classic progress bar, the interrupt flag, free_memory / get_free_memory / unload_all_models, the preview switch),
its nodes in ComfyUI's public API form: the graph still runs, progress and previews go through the public
``Execution.set_progress``, and the pack says once, per feature, what it lost.
"""

from __future__ import annotations

import re

import pytest
from comfy_client import ComfyClient
from test_comfyui_server import node_of, smoke_prompt

pytestmark = pytest.mark.timeout(2400)  # the session fixtures may build ComfyUI's venv first (minutes)

PAGE_FEATURES = {"supports_preview_metadata": True}  # what ComfyUI's page announces on its websocket
LOST = {  # feature -> what the pack does instead (nodes/bridge.py, nodes/memory_hooks.py)
    "the classic progress bar",
    "Cancel during a job",
    "the preview switch",
    "freeing the workers with ComfyUI's Unload models / Free model and node cache",
    "freeing the workers when ComfyUI needs their GPU for its own models",
}
WARNING = re.compile(r"dit-parallel: (.+?) needs ComfyUI's (.+?), which this ComfyUI lacks; ")


@pytest.fixture(scope="module")
def runs(comfy_server_without_hooks):
    """Two runs of the tiny workflow: one seen by a page-like client, one by a plain API client."""
    url = comfy_server_without_hooks.url
    with ComfyClient(url) as plain:
        object_info = plain.get("/object_info", timeout=120)
        prompt = smoke_prompt(object_info, steps=3, size=64)
        with ComfyClient(url, features=PAGE_FEATURES) as page:
            first = page.run(prompt, timeout=600)
        second = plain.run(smoke_prompt(object_info, steps=3, size=64), timeout=600)
        status = plain.get("/dit_parallel/status")
    return object_info, prompt, first, second, status


def test_the_hooks_were_renamed_and_the_nodes_are_public(comfy_server_without_hooks, runs):
    object_info = runs[0]
    assert "without_hooks: renamed" in comfy_server_without_hooks.log_text()
    sampler = object_info["DiTParallelSampler"]["input"]["required"]
    assert sampler["sampler_name"][0] == "COMBO" and "euler" in sampler["sampler_name"][1]["options"]


def test_the_graph_runs_with_progress_and_previews_through_the_public_api(runs):
    _, prompt, first, second, _ = runs
    sampler = node_of(prompt, "DiTParallelSampler")
    for run in (first, second):
        assert run.outcome == "execution_success", run.messages[-5:]
        states = [(value, top) for value, top, state in run.progress_states(sampler) if state == "running"]
        states = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]  # each node's state is in
        assert states[-3:] == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)], states  # every message: count changes
        assert run.progress(sampler) == []  # 0.3.64's set_progress sends no "progress" message: the reason the
        # pack uses the classic bar (which sends both) wherever it is there
    previews = [p for p, node in zip(first.previews, first.preview_nodes) if node == sampler]
    assert len(previews) == 3 and all(p[:2] == b"\xff\xd8" for p in previews)  # one JPEG a step, for the page
    assert second.previews == []  # a client that does not announce preview metadata gets none from set_progress


def test_each_lost_feature_is_said_once(comfy_server_without_hooks, runs):
    status = runs[-1]
    said = [m.group(1) for m in WARNING.finditer(comfy_server_without_hooks.log_text())]
    assert sorted(said) == sorted(LOST), said  # once each, over two prompts
    assert set(status["lost"]) == LOST
