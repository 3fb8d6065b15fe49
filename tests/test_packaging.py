"""How the pack installs: requirements.txt (what ComfyUI-Manager installs) equals pyproject's
dependencies, the pack imports from its own folder with nothing installed (a plain git clone), and the
wheel (``pip install .``) holds the engine users run and none of the checkout's dev tools.
The real install into a real ComfyUI is tests/comfyui/test_comfyui_server.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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


def test_a_checkout_finds_its_dev_tools_beside_the_engine(tmp_path):
    """The pack (and ``pip install -e .``, whose import finder maps only parallel_runtime) imports the engine
    from the checkout without the checkout's root on sys.path: the dev tools are found beside the engine,
    and finding them stays light."""
    code = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location(
    "dit_parallel_clone", {str(ROOT / "__init__.py")!r}, submodule_search_locations=[{str(ROOT)!r}])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
from parallel_runtime.checkout import devtools_module
tiny = devtools_module("tiny", "this test")
print(json.dumps({{"tiny": tiny.__file__, "models": tiny.TINY_MODELS, "on_path": {str(ROOT)!r} in sys.path,
                  "heavy": sorted(m for m in ("torch", "diffusers") if m in sys.modules)}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["tiny"] == str(ROOT / "dit_devtools" / "tiny" / "__init__.py")
    assert "tiny-flux" in out["models"] and not out["on_path"] and out["heavy"] == []


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel ``pip wheel .`` builds (setuptools' PEP 517 backend), from a copy of the project: the
    build writes into its source folder. The dev tools are copied too, so their absence is the build's."""
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".*", "__pycache__", "*.egg-info", "build", "dist", "tests", "docs", "test-artifacts"
        ),
    )
    build = "import sys, setuptools.build_meta as backend; print(backend.build_wheel(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "dist")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / "dist" / proc.stdout.strip().splitlines()[-1]


DEV_WORDS = ("train", "finetune", "fault", "shm_cells", "shapes_", "tiny")  # no module of the wheel is named so


def test_the_wheel_holds_what_users_run_and_no_dev_tools(tmp_path):
    from parallel_runtime.tools.cli import BENCHES

    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"parallel_runtime"}, (
        f"the wheel installs only the engine, not {sorted(tops - {'parallel_runtime'})}"
    )
    modules = [n for n in names if n.endswith(".py")]
    dev = [n for n in modules if any(w in n.rsplit("/", 1)[-1] for w in DEV_WORDS)]
    assert not dev, f"training, fault-injection or tiny-factory code in the wheel: {dev}"
    wanted = {
        "parallel_runtime/__main__.py",
        "parallel_runtime/checkout.py",
        "parallel_runtime/tools/cli.py",
        "parallel_runtime/tools/generate.py",
        "parallel_runtime/tools/doctor.py",
        "parallel_runtime/models/builtin.py",
        *(f"parallel_runtime/tools/{module}.py" for module, _ in BENCHES.values()),
    }
    trained = ROOT / "parallel_runtime" / "models" / "trained"
    shipped = {p.relative_to(ROOT).as_posix() for p in trained.rglob("*") if p.is_file()}
    assert any(n.endswith(".safetensors") for n in shipped) and any(n.endswith("model_index.json") for n in shipped)
    assert not (wanted | shipped) - set(names), f"missing from the wheel: {sorted((wanted | shipped) - set(names))}"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "dit-parallel = parallel_runtime.tools.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_the_installed_wheel_runs_the_trained_model_and_says_what_needs_a_checkout(tmp_path):
    """Installed from the wheel alone (unpacked onto PYTHONPATH, no checkout beside it): the shipped trained
    model is found; a random-weight tiny model and bench soak's fault matrix fail with what/why/fix."""
    site = tmp_path / "site"
    zipfile.ZipFile(_build_wheel(tmp_path)).extractall(site)
    code = """
import contextlib, io, json
import parallel_runtime
from parallel_runtime.models.builtin import builtin_model_path
from parallel_runtime.tools.cli import main
out = {"engine": parallel_runtime.__file__, "trained": str(builtin_model_path("tiny-flux-shapes"))}
for name, argv in {"generate": ["generate", "--model", "tiny-flux"], "soak": ["bench", "soak", "--quick"]}.items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        out[name] = [main(argv), err.getvalue()]
print(json.dumps(out))
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["engine"] == str(site / "parallel_runtime" / "__init__.py")
    assert Path(out["trained"]) == site / "parallel_runtime" / "models" / "trained" / "tiny-flux-shapes"
    assert (Path(out["trained"]) / "model_index.json").is_file()
    for name, what in (("generate", "the random-weight test model 'tiny-flux'"), ("soak", "bench soak's fault matrix")):
        rc, message = out[name]
        assert rc == 2, (name, message)
        assert what in message and "dit_devtools" in message and "why:" in message and "fix:" in message, message
