"""The pack the Comfy Registry would publish, installed as the registry installs it.

``comfy node pack`` (comfy-cli from PyPI, in a venv of its own) zips the git-tracked files minus
``.comfyignore``; that zip is unpacked into the custom_nodes of a fresh ComfyUI base directory, its
requirements.txt installed into ComfyUI's venv, and the server must import the nodes and draw the
shipped trained model's picture from nothing but the zip's files (no tests, no dev tools). The
metadata the registry shows (``[project]`` and ``[tool.comfy]``) is read by comfy-cli's own parser.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
import tomllib
from comfy_client import ComfyClient
from comfy_env import REPO
from comfy_server import ComfyServer, _git, clone_pack, pip_install_requirements
from workflow_api import ui_to_api

sys.path.insert(1, str(REPO / "tests"))
from venv_cache import cache_root, cached_venv, key_of  # noqa: E402

pytestmark = pytest.mark.timeout(2400)  # may build ComfyUI's venv and comfy-cli's first (minutes)

COMFY_CLI = "comfy-cli==1.23.0"
PACK_FOLDER = "dit-parallel-registry"
SMOKE = REPO / "workflows" / "tiny_flux_cpu_smoke.json"
KEPT_OUT = ("tests/", "dit_devtools/", "benchmarks/results/", ".ci/", "docs/icon.png")  # repository only
NEEDED = ("__init__.py", "requirements.txt", "pyproject.toml", "README.md", "nodes/__init__.py", "web/dit_parallel.js")


def _cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["HOME"] = str(home)  # comfy-cli keeps its settings (tracking off under --skip-prompt) there
    return env


@pytest.fixture(scope="module")
def comfy_cli() -> Path:
    python = cached_venv(cache_root() / f"comfy-cli-{key_of(COMFY_CLI)}", [[COMFY_CLI]])
    return python.parent / "comfy"


@pytest.fixture(scope="module")
def registry_zip(comfy_cli, tmp_path_factory) -> Path:
    """``comfy node pack`` of this checkout (its uncommitted and untracked files count as committed)."""
    work = tmp_path_factory.mktemp("registry-pack")
    checkout = work / "checkout"
    clone_pack(checkout)
    _git("add", "-A", cwd=checkout)  # comfy-cli packs what `git ls-files` lists: the index
    proc = subprocess.run(
        [str(comfy_cli), "--skip-prompt", "node", "pack"],
        cwd=checkout,
        env=_cli_env(work),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, f"comfy node pack failed:\n{proc.stdout}\n{proc.stderr}"
    return checkout / "node.zip"


def test_the_registry_zip_holds_what_comfyui_runs_and_nothing_of_the_repository_only(registry_zip):
    names = zipfile.ZipFile(registry_zip).namelist()
    for needed in NEEDED:
        assert needed in names, f"{needed} missing from the registry zip"
    assert any(n.startswith("parallel_runtime/models/trained/tiny-flux-shapes/") for n in names)
    assert any(n.startswith("workflows/") and n.endswith(".json") for n in names)
    leaked = sorted(n for n in names if n.startswith(KEPT_OUT))
    assert not leaked, f"repository-only files in the registry zip: {leaked[:10]}"
    assert registry_zip.stat().st_size < 20 * 2**20, "the pack should stay small (trained tiny model included)"


def test_the_registry_metadata_is_complete_and_names_every_family(comfy_cli, tmp_path):
    """comfy-cli's own parser reads pyproject.toml as the registry will; the description names each family the
    loader offers (it goes stale when a family lands without it) and the icon is a square picture in the repo."""
    script = (
        "import json, sys\n"
        "from comfy_cli.registry.config_parser import extract_node_configuration\n"
        "c = extract_node_configuration(sys.argv[1])\n"
        "print(json.dumps({'description': c.project.description, 'repository': c.project.urls.repository,\n"
        "  'issues': c.project.urls.issues, 'publisher': c.tool_comfy.publisher_id,\n"
        "  'display': c.tool_comfy.display_name, 'icon': c.tool_comfy.icon,\n"
        "  'comfyui': c.project.supported_comfyui_version, 'license': c.project.license.text}))\n"
    )
    python = comfy_cli.parent / "python"
    out = subprocess.run(
        [str(python), "-c", script, str(REPO / "pyproject.toml")],
        env=_cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    meta = json.loads(out.strip().splitlines()[-1])
    for key in ("repository", "issues", "publisher", "display", "icon", "comfyui", "license"):
        assert meta[key], f"[tool.comfy] / [project] lacks {key}"
    assert meta["repository"].startswith("https://") and meta["issues"].startswith(meta["repository"])

    from parallel_runtime.models.families.registry import FAMILIES

    missing = [f.label for f in FAMILIES if f.label not in meta["description"]]
    assert not missing, f"pyproject's description does not name {missing} (the Registry shows it)"
    icon_path = meta["icon"].rsplit("/main/", 1)[-1]
    icon = REPO / icon_path
    assert meta["icon"].startswith(meta["repository"].replace("github.com", "raw.githubusercontent.com"))
    png = icon.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n", f"{icon_path} is not a PNG"
    width, height = struct.unpack(">II", png[16:24])
    assert width == height >= 256, f"the registry icon should be square, at least 256 px: {width}x{height}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["description"] == project["description"]


def test_comfyui_runs_the_shipped_model_from_the_unpacked_registry_zip(
    registry_zip, comfy_python, comfy_snapshot, comfy_env, tmp_path
):
    """Unpacked into custom_nodes with its requirements installed (the registry's install), ComfyUI imports
    the pack and the smoke graph draws the trained tiny model's picture with nothing else of the repository."""
    base = tmp_path / "base"
    pack = base / "custom_nodes" / PACK_FOLDER
    pack.mkdir(parents=True)
    zipfile.ZipFile(registry_zip).extractall(pack)
    pip_install_requirements(comfy_python, pack / "requirements.txt", base / "pip-install.log")
    env = {**comfy_env, "DIT_PARALLEL_TINY_ROOT": str(tmp_path / "no-tiny-models")}  # only what ships
    server = ComfyServer(comfy_python, comfy_snapshot, base, env)
    try:
        server.start()
        log = server.log_text()
        assert f"Cannot import {pack}" not in log, log
        with ComfyClient(server.url) as client:
            info = client.get("/object_info", timeout=120)
            assert info["DiTParallelSampler"]["python_module"] == f"custom_nodes.{PACK_FOLDER}"
            prompt = ui_to_api(json.loads(SMOKE.read_text(encoding="utf-8")), info)
            for node in prompt.values():
                inputs = node["inputs"]
                if node["class_type"] == "DiTParallelModelLoader":
                    inputs["model"] = "tiny-flux-shapes"
                elif node["class_type"] == "DiTParallelEmptyLatent":
                    inputs.update(width=128, height=128)
                elif node["class_type"] == "DiTParallelSampler":
                    inputs.update(steps=4, cfg=2.0)
            run = client.run(prompt, timeout=600)
            assert run.outcome == "execution_success", run.messages[-5:]
            outputs = client.history(run.prompt_id)["outputs"]
            (sink,) = [k for k, v in prompt.items() if v["class_type"] == "PreviewImage"]
            (image,) = outputs[sink]["images"]
            url = f"{client.url}/view?filename={image['filename']}&type=temp"
            with urllib.request.urlopen(url, timeout=30) as answer:
                png = answer.read()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (128, 128)
    finally:
        server.stop()
        alive, segments = server.leftovers()
        server.kill_leftovers()
    assert not alive and not segments, f"left after ComfyUI stopped: workers {alive}, segments {segments}"
