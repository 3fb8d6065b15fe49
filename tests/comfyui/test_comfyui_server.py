"""The pack in a real ComfyUI server, driven over HTTP and the websocket as the page drives it.

The shipped tiny workflow runs end to end on two CPU worker ranks; Cancel keeps the workers warm;
a worker killed mid-run becomes an execution_error naming its rank and the next prompt runs on a
fresh pool. (The session fixture checks at the end that no worker or /dev/shm segment is left.)
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import struct
import subprocess
import time
import urllib.request
from typing import Any

import pytest
from comfy_client import ComfyClient, Run, http_error
from comfy_server import PACK_FOLDER, pid_alive
from conftest import REPO
from workflow_api import ui_to_api

pytestmark = pytest.mark.timeout(2400)  # the session fixtures may build ComfyUI's venv first (minutes)

SMOKE = REPO / "workflows" / "tiny_flux_cpu_smoke.json"
OUR_NODES = {
    "DiTParallelModelLoader": "Parallel Model Loader",
    "DiTParallelTextEncode": "Parallel Text Encode",
    "DiTParallelTextEncodeQwenImageEdit": "Parallel Text Encode Qwen Image Edit",
    "DiTParallelTextEncodeQwenImageEditPlus": "Parallel Text Encode Qwen Image Edit Plus",
    "DiTParallelEmptyLatent": "Parallel Empty Latent",
    "DiTParallelHunyuanVideo15ImageToVideo": "Parallel HunyuanVideo 1.5 Image To Video",
    "DiTParallelSampler": "Parallel Sampler",
    "DiTParallelVAEDecode": "Parallel VAE Decode",
    "DiTParallelUnload": "Parallel Runtime Unload",
}
LONG_STEPS = 2000  # long enough to act mid-run (each tiny step takes milliseconds)
_seeds = itertools.count(1000)  # a new seed per prompt: ComfyUI would answer an unchanged prompt from its cache


def smoke_prompt(object_info: dict[str, Any], steps: int | None = None, size: int | None = None) -> dict[str, Any]:
    """The shipped tiny workflow in API format, with a fresh seed (and optionally fewer/more steps
    or another size)."""
    prompt = ui_to_api(json.loads(SMOKE.read_text(encoding="utf-8")), object_info)
    sampler = node_of(prompt, "DiTParallelSampler")
    prompt[sampler]["inputs"]["seed"] = next(_seeds)
    if steps is not None:
        prompt[sampler]["inputs"]["steps"] = steps
    if size is not None:
        latent = node_of(prompt, "DiTParallelEmptyLatent")
        prompt[latent]["inputs"].update(width=size, height=size)
    return prompt


def node_of(prompt: dict[str, Any], class_type: str) -> str:
    (node,) = [k for k, v in prompt.items() if v["class_type"] == class_type]
    return node


def when_step(node: str, step: int, action):
    """An on_message callback running ``action()`` once, when ``node`` reports progress >= step."""
    done = []

    def on_message(run: Run, message: dict[str, Any]) -> None:
        data = message.get("data") or {}
        if not done and message["type"] == "progress" and str(data.get("node")) == node and data["value"] >= step:
            done.append(data["value"])
            action()

    return on_message


def test_pack_installs_from_requirements_and_imports_from_its_folder(comfy_server, comfy_python, object_info):
    """Installed as ComfyUI-Manager installs it (clone + requirements.txt): ComfyUI imports the pack,
    publishes its nodes and web folder, and parallel_runtime comes from the pack's own folder (it is
    not installed into ComfyUI's Python)."""
    installed = subprocess.run(
        [str(comfy_python), "-c", "import importlib.util; print(importlib.util.find_spec('parallel_runtime'))"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    assert installed == "None", f"parallel_runtime is installed in ComfyUI's venv ({installed}); the test needs it not"
    log = comfy_server.log_text()
    pack = f"custom_nodes/{PACK_FOLDER}"
    timings = [line for line in log.splitlines() if "seconds" in line and line.rstrip().endswith(pack)]
    assert timings, (
        f"ComfyUI did not list the pack among the imported custom nodes:\n{log}"
    )  # failures end "(IMPORT FAILED)"
    assert f"Cannot import {comfy_server.base / pack}" not in log, log
    for name, display in OUR_NODES.items():
        assert name in object_info, f"{name} missing from /object_info"
        assert object_info[name]["display_name"] == display
        assert object_info[name]["category"] == "DiT Parallel"
        assert object_info[name]["python_module"] == f"custom_nodes.{PACK_FOLDER}"
    assert "tiny-flux" in object_info["DiTParallelModelLoader"]["input"]["required"]["model"][0]
    edit_plus = object_info["DiTParallelTextEncodeQwenImageEditPlus"]["input"]  # TextEncodeQwenImageEditPlus's
    assert list(edit_plus["optional"]) == ["vae", "image1", "image2", "image3"] and "prompt" in edit_plus["required"]
    with ComfyClient(comfy_server.url) as client:
        scripts = client.get("/extensions")
        assert f"/extensions/{PACK_FOLDER}/dit_parallel.js" in scripts
        assert client.get("/dit_parallel/status")["type"] == "snapshot"


def test_tiny_workflow_end_to_end_with_one_progress_message_per_step_and_previews(comfy, object_info):
    prompt = smoke_prompt(object_info)
    sampler = node_of(prompt, "DiTParallelSampler")
    steps = prompt[sampler]["inputs"]["steps"]
    run = comfy.run(prompt, timeout=600)
    assert run.outcome == "execution_success", run.messages[-5:]
    assert run.progress(sampler) == list(range(1, steps + 1)), "one progress message per step, in order"
    assert run.previews, "no preview image under --preview-method auto"
    assert all(p[:2] == b"\xff\xd8" for p in run.previews), "previews are JPEG images"
    outputs = comfy.history(run.prompt_id)["outputs"]
    sink, loader = node_of(prompt, "PreviewImage"), node_of(prompt, "DiTParallelModelLoader")
    (image,) = outputs[sink]["images"]
    assert image["type"] == "temp"
    with urllib.request.urlopen(f"{comfy.url}/view?filename={image['filename']}&type=temp", timeout=30) as answer:
        png = answer.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (256, 256)  # the saved size
    assert "tiny-flux (flux) on cpu:2" in " ".join(outputs[loader]["text"])  # the layout text on the loader


def test_cancel_mid_run_keeps_the_workers_warm(comfy, comfy_server, object_info):
    comfy.run(smoke_prompt(object_info, steps=2), timeout=600)  # the pool is up
    before = comfy_server.worker_pids()
    assert len(before) == 2, before
    prompt = smoke_prompt(object_info, steps=LONG_STEPS, size=64)
    sampler = node_of(prompt, "DiTParallelSampler")
    run = comfy.run(prompt, timeout=300, on_message=when_step(sampler, 3, lambda: comfy.post("/interrupt")))
    assert run.outcome == "execution_interrupted", run.messages[-5:]
    assert max(run.progress(sampler)) < LONG_STEPS
    assert comfy_server.worker_pids() == before, "Cancel restarted the workers"
    again = comfy.run(smoke_prompt(object_info, steps=2), timeout=300)
    assert again.outcome == "execution_success", again.messages[-5:]
    assert comfy_server.worker_pids() == before


def test_killed_worker_is_an_error_naming_its_rank_and_the_next_prompt_runs(comfy, comfy_server, object_info):
    comfy.run(smoke_prompt(object_info, steps=2), timeout=600)
    old = comfy_server.worker_pids()
    assert len(old) == 2, old
    old_segments = comfy_server.shm_segments()
    assert old_segments
    prompt = smoke_prompt(object_info, steps=LONG_STEPS, size=64)
    sampler = node_of(prompt, "DiTParallelSampler")
    run = comfy.run(prompt, timeout=300, on_message=when_step(sampler, 3, lambda: os.kill(old[1], signal.SIGKILL)))
    assert run.outcome == "execution_error", run.messages[-5:]
    error = run.error()
    assert error["node_id"] == sampler
    assert "rank 1" in error["exception_message"], error["exception_message"]
    assert comfy_server.alive()
    deadline = time.monotonic() + 30
    while comfy.get("/queue")["queue_running"] and time.monotonic() < deadline:
        time.sleep(0.2)  # the error is sent before the queue marks the prompt done
    assert comfy.get("/queue")["queue_running"] == []
    while (pid_alive(old[0]) or set(old_segments) & set(comfy_server.shm_segments())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pid_alive(old[0]), "the surviving worker of the broken pool is still running"
    assert not set(old_segments) & set(comfy_server.shm_segments()), "the broken pool's segments were not unlinked"
    again = comfy.run(smoke_prompt(object_info, steps=2), timeout=300)
    assert again.outcome == "execution_success", again.messages[-5:]
    fresh = comfy_server.worker_pids()
    assert len(fresh) == 2 and not set(fresh.values()) & set(old.values())


def test_the_pack_finds_every_piece_of_comfyui_it_uses(comfy, comfy_server, object_info):
    """On the ComfyUI it is tested with, no feature is lost (tests/comfyui/test_comfyui_without_hooks.py: a
    ComfyUI without them); the progress bar moves once a step and the previews arrive (classic bar). Runs on the
    warm pool after the Cancel and killed-worker paths; the free/unload paths check ``lost`` at their end."""
    run = comfy.run(smoke_prompt(object_info, steps=2), timeout=600)
    assert run.outcome == "execution_success", run.messages[-5:]
    assert comfy.get("/dit_parallel/status")["lost"] == {}
    assert "which this ComfyUI lacks" not in comfy_server.log_text()


def test_workers_stay_warm_across_prompts_and_leave_when_the_user_frees_memory(comfy, comfy_server, object_info):
    """The server runs with --disable-smart-memory, so ComfyUI unloads its models after every
    prompt: the workers stay. "Unload models" (POST /free) frees them; the next prompt starts a
    fresh pool."""
    comfy.run(smoke_prompt(object_info, steps=2), timeout=600)
    warm = comfy_server.worker_pids()
    assert len(warm) == 2
    for _ in range(2):
        assert comfy.run(smoke_prompt(object_info, steps=2), timeout=300).outcome == "execution_success"
        assert comfy_server.worker_pids() == warm, "the workers were restarted between prompts"
    comfy.post("/free", {"unload_models": True})
    # ComfyUI's prompt loop unloads asynchronously, and the panel drops a pool only once its
    # teardown (reaping, segment sweep) is complete, a moment after the processes are gone.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        any(pid_alive(p) for p in warm.values()) or comfy.get("/dit_parallel/status")["pools"]
    ):
        time.sleep(0.2)
    assert not any(pid_alive(p) for p in warm.values()), "Unload models did not stop the workers"
    assert comfy.get("/dit_parallel/status")["pools"] == []
    again = comfy.run(smoke_prompt(object_info, steps=2), timeout=300)
    assert again.outcome == "execution_success", again.messages[-5:]
    fresh = comfy_server.worker_pids()
    assert len(fresh) == 2 and not set(fresh.values()) & set(warm.values())
    assert comfy.post("/dit_parallel/unload")["pools"] == []  # the panel's "Unload workers" button
    assert not any(pid_alive(p) for p in fresh.values())
    assert comfy.get("/dit_parallel/status")["lost"] == {}  # nor on these paths (test_the_pack_finds_every_piece...)


def test_a_device_problem_is_reported_once(comfy_server, object_info):
    prompt = smoke_prompt(object_info)
    loader = node_of(prompt, "DiTParallelModelLoader")
    prompt[loader]["inputs"]["devices"] = "cuda:0,cuda:1"  # this machine has no GPU
    status, answer = http_error(f"{comfy_server.url}/prompt", {"prompt": prompt})
    assert status == 400
    errors = answer["node_errors"][loader]["errors"]
    assert len(errors) == 1, errors
    assert errors[0]["extra_info"]["input_name"] == "devices"
    assert "CUDA GPU" in errors[0]["details"]
