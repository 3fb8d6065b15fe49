"""How the pack installs: requirements.txt (what ComfyUI-Manager installs) equals pyproject's
dependencies, and the pack imports from its own folder with nothing installed (a plain git clone).
The real install into a real ComfyUI is tests/comfyui/test_comfyui_server.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pack_import import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (CI's); 3.10 reads the file the same way with tomli


def requirement_lines(text: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_requirements_txt_equals_pyprojects_dependencies():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    listed = requirement_lines((ROOT / "requirements.txt").read_text(encoding="utf-8"))
    assert listed == declared, "keep requirements.txt equal to [project] dependencies in pyproject.toml"


def test_pack_imports_from_its_own_folder_with_nothing_installed(tmp_path):
    """Without site-packages (-S: no installed parallel_runtime, no torch) ComfyUI's way of importing
    a custom node folder works, and parallel_runtime comes from the pack's folder."""
    code = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location(
    "dit_parallel_clone", {str(ROOT / "__init__.py")!r}, submodule_search_locations=[{str(ROOT)!r}])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
print(json.dumps({{"nodes": sorted(module.NODE_CLASS_MAPPINGS), "runtime": sys.modules["parallel_runtime"].__file__,
                  "web": module.WEB_DIRECTORY, "heavy": sorted(m for m in ("torch", "diffusers") if m in sys.modules)}}))
"""
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["runtime"] == str(ROOT / "parallel_runtime" / "__init__.py")
    assert "DiTParallelModelLoader" in out["nodes"] and len(out["nodes"]) >= 6
    assert out["web"] == "./web"
    assert out["heavy"] == [], "importing the pack must stay light (ComfyUI imports every pack at start)"
