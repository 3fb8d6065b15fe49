"""Fixtures for the tests against a real ComfyUI (the snapshot in ../shared/ComfyUI).

One session: the ComfyUI venv (built once, see comfy_env.py), an isolated base directory with the
pack cloned into custom_nodes and its requirements.txt installed, tiny models in its models folder,
one server on a free port, and the oracle's answers (node definitions, validate_prompt results).
At the end the server is stopped and nothing of it may be left: no worker process, no segment in
/dev/shm.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from comfy_client import ComfyClient
from comfy_env import REPO, ensure_venv, snapshot_dir, snapshot_problem
from comfy_server import PACK_FOLDER, START_TIMEOUT_S, ComfyServer, clone_pack, pip_install_requirements

HERE = Path(__file__).resolve().parent
WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
ARTIFACTS_ENV = "DIT_PARALLEL_ARTIFACTS"
VISIBLE_GPUS_FOR_VALIDATION = 8  # the shipped workflows are for GPU machines (see comfy_oracle.py)
NODE_FORM_ENV = "DIT_PARALLEL_NODE_FORM"  # public / classic: the form the pack registers its nodes in

# The model files the shipped workflows name, stood in by the tiny random models:
# path under models/ -> (tiny model, path inside it; "" for the whole diffusers folder)
TINY_STAND_INS: dict[str, tuple[str, str]] = {
    "diffusers/FLUX.1-dev": ("tiny-flux", ""),
    "diffusers/stable-diffusion-3.5-medium": ("tiny-sd3", ""),
    "diffusers/PixArt-Sigma-XL-2-1024-MS": ("tiny-pixart", ""),
    "diffusers/HunyuanVideo-1.5-Diffusers-480p_t2v": ("tiny-hunyuan-video-1.5", ""),
    # a real folder the t2v stand-in does not use (the loader lists each real folder once)
    "diffusers/HunyuanVideo-1.5-Diffusers-480p_i2v": ("tiny-hunyuan-video", ""),
    "checkpoints/ltx-2-19b-dev.safetensors": (  # where ComfyUI's template keeps it; validation only reads the name
        "tiny-ltx2",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "text_encoders/gemma_3_12B_it.safetensors": ("tiny-ltx2", "text_encoder/model.safetensors"),
    "diffusion_models/flux1-dev.safetensors": ("tiny-flux", "transformer/diffusion_pytorch_model.safetensors"),
    "vae/ae.safetensors": ("tiny-flux", "vae/diffusion_pytorch_model.safetensors"),
    "vae/sd3.5_vae.safetensors": ("tiny-sd3", "vae/diffusion_pytorch_model.safetensors"),
    "text_encoders/clip_l.safetensors": ("tiny-flux", "text_encoder/model.safetensors"),
    "text_encoders/t5xxl_fp16.safetensors": ("tiny-flux", "text_encoder_2/model.safetensors"),
    "diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors": (
        "tiny-wan",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/wan2.1_i2v_480p_14B_fp16.safetensors": (
        "tiny-wan-i2v",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/wan2.2_t2v_high_noise_14B_fp16.safetensors": (
        "tiny-wan-a14b",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/wan2.2_t2v_low_noise_14B_fp16.safetensors": (
        "tiny-wan-a14b",
        "transformer_2/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/wan2.2_ti2v_5B_fp16.safetensors": (
        "tiny-wan-ti2v",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/wan2.1_vace_14B_fp16.safetensors": (  # validation only reads the name
        "tiny-wan",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "vae/wan_2.1_vae.safetensors": ("tiny-wan", "vae/diffusion_pytorch_model.safetensors"),
    "vae/wan2.2_vae.safetensors": ("tiny-wan-ti2v", "vae/diffusion_pytorch_model.safetensors"),
    "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors": ("tiny-wan", "text_encoder/model.safetensors"),
    "clip_vision/clip_vision_h.safetensors": ("tiny-wan-i2v", "image_encoder/model.safetensors"),
    "clip_vision/sigclip_vision_patch14_384.safetensors": ("tiny-wan-i2v", "image_encoder/model.safetensors"),
    "diffusion_models/hunyuan_video_t2v_720p_bf16.safetensors": (
        "tiny-hunyuan-video",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/hunyuan_video_v2_replace_image_to_video_720p_bf16.safetensors": (  # its tensors are T2V's
        "tiny-hunyuan-video",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "clip_vision/llava_llama3_vision.safetensors": (  # validation only reads the name
        "tiny-wan-i2v",
        "image_encoder/model.safetensors",
    ),
    "vae/hunyuan_video_vae_bf16.safetensors": ("tiny-hunyuan-video", "vae/diffusion_pytorch_model.safetensors"),
    "text_encoders/llava_llama3_fp8_scaled.safetensors": ("tiny-hunyuan-video", "text_encoder/model.safetensors"),
    "diffusion_models/ltx-video-2b-v0.9.safetensors": (
        "tiny-ltx-video",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "checkpoints/ltx-video-2b-v0.9.safetensors": (  # validation only reads the name
        "tiny-ltx-video",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/flux1-kontext-dev.safetensors": ("tiny-flux", "transformer/diffusion_pytorch_model.safetensors"),
    "diffusion_models/flux1-fill-dev.safetensors": ("tiny-flux", "transformer/diffusion_pytorch_model.safetensors"),
    "diffusion_models/qwen_image_edit_2509_fp8_e4m3fn.safetensors": (
        "tiny-qwen-image",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/qwen_image_edit_fp8_e4m3fn.safetensors": (
        "tiny-qwen-image",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "diffusion_models/qwen_image_fp8_e4m3fn.safetensors": (
        "tiny-qwen-image",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "vae/qwen_image_vae.safetensors": ("tiny-qwen-image", "vae/diffusion_pytorch_model.safetensors"),
    "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors": ("tiny-qwen-image", "text_encoder/model.safetensors"),
    "diffusion_models/z_image_turbo_bf16.safetensors": (
        "tiny-z-image",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "text_encoders/qwen_3_4b.safetensors": ("tiny-z-image", "text_encoder/model.safetensors"),
    "diffusion_models/Chroma1-HD.safetensors": ("tiny-chroma", "transformer/diffusion_pytorch_model.safetensors"),
    "diffusion_models/sd3.5_large.safetensors": ("tiny-sd3", "transformer/diffusion_pytorch_model.safetensors"),
    "text_encoders/clip_g.safetensors": ("tiny-sd3", "text_encoder_2/model.safetensors"),
    "diffusion_models/hidream_i1_full_fp16.safetensors": (
        "tiny-hidream",
        "transformer/diffusion_pytorch_model.safetensors",
    ),
    "text_encoders/clip_l_hidream.safetensors": ("tiny-flux", "text_encoder/model.safetensors"),
    "text_encoders/clip_g_hidream.safetensors": ("tiny-sd3", "text_encoder_2/model.safetensors"),
    "text_encoders/llama_3.1_8b_instruct_fp8_scaled.safetensors": (
        "tiny-hunyuan-video",
        "text_encoder/model.safetensors",
    ),
}
# LoadImage's files the shipped workflows name (ComfyUI's input/)
INPUT_IMAGES = (
    "wan_start_image.png",
    "kontext_input.png",
    "qwen_edit_person.png",
    "qwen_edit_scene.png",
    "fill_input.png",
    "controlnet_canny_input.png",
    "ltx_start_image.png",
    "hunyuan_video15_start_image.png",
    "hunyuan_start_image.png",
)
INPUT_VIDEOS = ("wan_control_pose.mp4",)  # LoadVideo's files: validate_prompt checks the name, never decodes it

# The LoRA, ControlNet and model patch files the shipped workflows name, stood in by tiny test files (under tests/data).
LORA_STAND_INS: dict[str, str] = {
    "loras/flux_style_lora.safetensors": "lora/flux_kohya.safetensors",
    "loras/flux_character_lora.safetensors": "lora/flux_peft.safetensors",
    "controlnet/FLUX.1-dev-ControlNet-Union-Pro.safetensors": "tiny_flux_controlnet_union.safetensors",
    "model_patches/qwen_image_canny_diffsynth_controlnet.safetensors": "tiny_qwen_diffsynth_controlnet.safetensors",
}


def _ensure_tiny_model(name: str) -> Path:
    from dit_devtools.tiny import ensure_tiny_model

    return ensure_tiny_model(name)


def artifacts_dir() -> Path:
    """Where screenshots and server logs are kept: $DIT_PARALLEL_ARTIFACTS or test-artifacts/."""
    path = Path(os.environ.get(ARTIFACTS_ENV) or REPO / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def comfy_snapshot() -> Path:
    snapshot = snapshot_dir()
    problem = snapshot_problem(snapshot)
    if problem:
        pytest.fail(problem)
    return snapshot


@pytest.fixture(scope="session")
def comfy_python(comfy_snapshot) -> Path:
    return ensure_venv(comfy_snapshot)


def _lay_out_models(models: Path) -> None:
    for rel, (tiny, inside) in TINY_STAND_INS.items():
        target = _ensure_tiny_model(tiny) / inside if inside else _ensure_tiny_model(tiny)
        link = models / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=target.is_dir())
    for rel, name in LORA_STAND_INS.items():
        link = models / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(REPO / "tests" / "data" / name)


def _put_input_images(folder: Path) -> None:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name in INPUT_IMAGES:
        Image.new("RGB", (64, 48), (200, 120, 40)).save(folder / name)
    for name in INPUT_VIDEOS:
        (folder / name).write_bytes(b"\x00\x00\x00\x18ftypmp42")  # an MP4 header: named and found, not played


@pytest.fixture(scope="session")
def comfy_base(tmp_path_factory, comfy_python) -> Path:
    """The --base-directory: custom_nodes/dit-parallel (a git clone of this commit, its
    requirements.txt installed into ComfyUI's venv), models/ with the tiny stand-ins, and user
    settings of someone who has seen the first-run tour."""
    base = tmp_path_factory.mktemp("comfyui-base")
    pack = base / "custom_nodes" / PACK_FOLDER
    pack.parent.mkdir(parents=True)
    clone_pack(pack)
    pip_install_requirements(comfy_python, pack / "requirements.txt", base / "pip-install.log")
    _lay_out_models(base / "models")
    _put_input_images(base / "input")
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    return base


@pytest.fixture(scope="session")
def comfy_env(comfy_base, comfy_python) -> dict[str, str]:
    """The server's environment: the machine's, without this test venv's Python settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(comfy_python.parent), *env.get("PATH", "").split(os.pathsep)])
    env["PYTHONPYCACHEPREFIX"] = str(comfy_python.parent.parent / "pycache")  # never into the snapshot
    env["DIT_PARALLEL_TINY_ROOT"] = str(comfy_base / "models" / "dit-parallel-tiny")
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def written_since(root: Path, since: float) -> list[str]:
    """Paths under ``root`` created or changed after ``since`` (a folder's mtime moves when an entry
    is added to it)."""
    changed = []
    for dirpath, _, filenames in os.walk(root):
        for name in [".", *filenames]:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_mtime > since:
                    changed.append(os.path.relpath(path, root))
    return changed


@pytest.fixture(scope="session")
def comfy_server(early_servers, comfy_python, comfy_snapshot, comfy_base, comfy_env):
    """The session's server, shared by the modules that run graphs on the pack as installed (server, browser,
    ControlNet). --disable-smart-memory: ComfyUI then unloads its models after every prompt; the workers must stay
    warm. Started through tiny_widths.py: ComfyUI's own Flux detection reads a tiny file's widths (the ControlNet
    graph's KSampler path loads tiny files through ComfyUI's loaders; the pack's nodes never use that detection)."""
    started = time.time()
    server = ComfyServer(
        comfy_python,
        comfy_snapshot,
        comfy_base,
        comfy_env,
        extra_args=("--disable-smart-memory",),
        launcher=HERE / "tiny_widths.py",
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        (artifacts_dir() / "comfyui-server.log").write_text(server.log_text())
        alive, segments = server.leftovers()
        server.kill_leftovers()
    assert not alive, f"worker processes left after ComfyUI stopped: {alive}"
    assert not segments, f"/dev/shm segments left after ComfyUI stopped: {segments}"
    written = written_since(comfy_snapshot, started)
    assert not written, f"the tests wrote into the ComfyUI snapshot {comfy_snapshot}: {written[:20]}"


@pytest.fixture
def comfy(comfy_server):
    """A websocket session with the running server (fails the test if ComfyUI died in it)."""
    with ComfyClient(comfy_server.url) as client:
        yield client
    assert comfy_server.alive(), f"ComfyUI died:\n{comfy_server.log_tail()}"


@pytest.fixture(scope="session")
def object_info(comfy_server) -> dict[str, Any]:
    with ComfyClient(comfy_server.url) as client:
        return client.get("/object_info", timeout=120)


SMOKE_PROBE = {"workflow": "tiny_flux_cpu_smoke.json", "class_type": "DiTParallelModelLoader", "input": "family"}


ORACLE_FORMS = {  # oracle fixture -> the environment it adds: the pack's nodes in the form it chooses, or public forced
    "comfy_oracle": {},
    "comfy_public_oracle": {NODE_FORM_ENV: "public"},
}


def start_oracle(comfy_python, comfy_snapshot, comfy_base, env: dict[str, str], work: Path) -> subprocess.Popen:
    """ComfyUI's own answers, computed in its venv with the pack loaded (see comfy_oracle.py): started."""
    request = {
        "snapshot": str(comfy_snapshot),
        "base": str(comfy_base),
        "pack_folder": PACK_FOLDER,
        "visible_gpus": VISIBLE_GPUS_FOR_VALIDATION,
        "workflows": {p.name: json.loads(p.read_text(encoding="utf-8")) for p in WORKFLOWS},
        "choice_probe": SMOKE_PROBE,
    }
    (work / "request.json").write_text(json.dumps(request))
    with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
        return subprocess.Popen(
            [str(comfy_python), str(HERE / "comfy_oracle.py"), str(work / "request.json"), str(work / "out.json")],
            cwd=work,
            env=env,
            stdout=out,
            stderr=err,
        )


def oracle_answers(proc: subprocess.Popen, work: Path, timeout_s: float = 600) -> dict[str, Any]:
    """The answers of a started comfy_oracle.py run (fails the test when it failed)."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stdout, stderr = ((work / name).read_text(errors="replace") for name in ("stdout.txt", "stderr.txt"))
    if proc.returncode != 0:
        pytest.fail(f"comfy_oracle.py failed (exit {proc.returncode}):\n{stdout[-4000:]}\n{stderr[-4000:]}")
    out = json.loads((work / "out.json").read_text())
    out["log"] = stdout + stderr
    return out


@pytest.fixture(scope="session")
def oracle_runs(request, comfy_python, comfy_snapshot, comfy_base, comfy_env, tmp_path_factory):
    """``oracle_runs(fixture name)`` -> (the started comfy_oracle.py run, its folder). At the first call every form
    the session's tests use is started, side by side (each run is one process on one core, mostly importing)."""
    runs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(name: str) -> None:
        work = tmp_path_factory.mktemp(name.replace("_", "-"))
        runs[name] = (
            start_oracle(comfy_python, comfy_snapshot, comfy_base, {**comfy_env, **ORACLE_FORMS[name]}, work),
            work,
        )

    def get(name: str) -> tuple[subprocess.Popen, Path]:
        if not runs:
            used = {f for item in request.session.items for f in getattr(item, "fixturenames", ())}
            for other in ORACLE_FORMS:
                if other != name and other in used:
                    start(other)
        if name not in runs:
            start(name)
        return runs[name]

    yield get
    for proc, _ in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def comfy_oracle(oracle_runs) -> dict[str, Any]:
    """ComfyUI's own answers with the pack in the form it chooses itself."""
    return oracle_answers(*oracle_runs("comfy_oracle"))


@pytest.fixture(scope="session")
def comfy_public_oracle(oracle_runs) -> dict[str, Any]:
    """ComfyUI's own answers with the pack's nodes in ComfyUI's public API form (io.ComfyNode), forced."""
    return oracle_answers(*oracle_runs("comfy_public_oracle"))


def pytest_report_header(config) -> list[str]:
    return [f"ComfyUI snapshot: {snapshot_dir()} (python {sys.version.split()[0]} runs the tests)"]


def without_hooks_server(comfy_python, comfy_snapshot, comfy_base, comfy_env, base: Path) -> ComfyServer:
    """A second server (not started), run by without_hooks.py (the internals the pack reaches renamed away, as a later
    ComfyUI might have them) with the pack's nodes in the public API form; the same pack clone and models as
    ``comfy_base``, in a base directory of its own (database, user, output)."""
    for shared in ("custom_nodes", "models", "input"):
        (base / shared).symlink_to(comfy_base / shared, target_is_directory=True)
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True}))
    env = {**comfy_env, NODE_FORM_ENV: "public"}
    return ComfyServer(  # (ComfyUI's API nodes import the renamed ProgressBar: they are not part of this test)
        comfy_python, comfy_snapshot, base, env, extra_args=("--disable-api-nodes",), launcher=HERE / "without_hooks.py"
    )


@pytest.fixture(scope="session")
def early_servers(request, comfy_python, comfy_snapshot, comfy_base, comfy_env, tmp_path_factory):
    """The other servers the session's tests use (fixture name -> server), launched at once, before the session's
    server: a start is mostly one process importing on one core, so they overlap. A module fixture takes its server
    out (``pop``), waits for it and stops it at its end; any left are stopped here."""
    used = {f for item in request.session.items for f in getattr(item, "fixturenames", ())}
    servers: dict[str, ComfyServer] = {}
    if "comfy_server_without_hooks" in used:
        base = tmp_path_factory.mktemp("comfyui-base-without-hooks")
        servers["comfy_server_without_hooks"] = without_hooks_server(
            comfy_python, comfy_snapshot, comfy_base, comfy_env, base
        )
    for server in servers.values():
        server.launch()
    yield servers
    for server in servers.values():
        server.stop()
        server.kill_leftovers()


@pytest.fixture(scope="module")
def comfy_server_without_hooks(early_servers, comfy_python, comfy_snapshot, comfy_base, comfy_env, tmp_path_factory):
    """The without_hooks.py server (see ``without_hooks_server``), launched early by ``early_servers``."""
    server = early_servers.pop("comfy_server_without_hooks", None)
    if server is None:  # (asked for by name at run time: launched now)
        base = tmp_path_factory.mktemp("comfyui-base-without-hooks")
        server = without_hooks_server(comfy_python, comfy_snapshot, comfy_base, comfy_env, base)
        server.launch()
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield server
    finally:
        server.stop()
        (artifacts_dir() / "comfyui-server-without-hooks.log").write_text(server.log_text())
        alive, segments = server.leftovers()
        server.kill_leftovers()
    assert not alive, f"worker processes left after ComfyUI stopped: {alive}"
    assert not segments, f"/dev/shm segments left after ComfyUI stopped: {segments}"
