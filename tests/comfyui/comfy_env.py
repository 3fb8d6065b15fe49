"""Where the ComfyUI snapshot is, and the separate Python environment that runs it.

ComfyUI's model code imports torchvision, and a real ComfyUI install has its own packages; so the
server runs in its own venv (torch 2.14.1 + torchvision 0.29.1, a pair known to import together,
plus the snapshot's requirements.txt without torch*, plus ``gguf`` for ComfyUI-GGUF), never in the test venv. It is built once,
under a lock, outside the repository (``~/.cache/dit-parallel/``; $DIT_PARALLEL_COMFY_VENV points at
a ready one instead) and reused by later runs. Run this file to build it ahead of the tests.

Nothing here writes into the snapshot: it is only read.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/ (when run as a script)
from venv_cache import cache_root, cached_venv, key_of, venv_python  # noqa: E402

log = logging.getLogger("dit_parallel.tests.comfyui")

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT_ENV = "DIT_PARALLEL_COMFYUI"
VENV_ENV = "DIT_PARALLEL_COMFY_VENV"
TORCH_PINS = ("torch==2.14.1", "torchvision==0.29.1")
SKIPPED_REQUIREMENTS = ("torch", "torchvision", "torchaudio")  # pinned above / not needed
EXTRA_PACKAGES = ("gguf>=0.13",)  # ComfyUI-GGUF's requirement: its nodes are the oracle of the GGUF tests


def snapshot_dir() -> Path:
    """$DIT_PARALLEL_COMFYUI, else ``shared/ComfyUI`` beside the repository (CI's layout) or beside a
    folder above it (a git worktree nested deeper)."""
    env = os.environ.get(SNAPSHOT_ENV)
    if env:
        return Path(env).resolve()
    for parent in REPO.parents:
        candidate = parent / "shared" / "ComfyUI"
        if (candidate / "main.py").is_file():
            return candidate
    return REPO.parent / "shared" / "ComfyUI"


def snapshot_problem(snapshot: Path) -> str | None:
    """Why ``snapshot`` cannot be used (None when it looks like a ComfyUI checkout)."""
    for name in ("main.py", "execution.py", "nodes.py", "requirements.txt"):
        if not (snapshot / name).is_file():
            return (
                f"the ComfyUI snapshot is missing at {snapshot} (no {name}); CI keeps it at ../shared/ComfyUI "
                f"next to the repository; set ${SNAPSHOT_ENV} to a ComfyUI 0.3.64 source folder"
            )
    return None


def _requirements(snapshot: Path) -> list[str]:
    """The snapshot's requirements without comments and without torch/torchvision/torchaudio."""
    out = []
    for line in (snapshot / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        name = line.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        if line and name.lower() not in SKIPPED_REQUIREMENTS:
            out.append(line)
    return out


def default_venv(snapshot: Path) -> Path:
    return cache_root() / f"comfyui-venv-{key_of(*TORCH_PINS, *_requirements(snapshot), *EXTRA_PACKAGES)}"


def ensure_venv(snapshot: Path | None = None, venv: Path | None = None) -> Path:
    """The ComfyUI venv's python, building the venv first when it is not ready.

    $DIT_PARALLEL_COMFY_VENV (or ``venv``) names a venv to use as it is; otherwise one is built under
    ~/.cache/dit-parallel keyed by the pins, the snapshot's requirements and the Python version."""
    snapshot = snapshot or snapshot_dir()
    given = venv or (Path(os.environ[VENV_ENV]) if os.environ.get(VENV_ENV) else None)
    if given is not None:
        python = venv_python(given)
        if not python.is_file():
            raise RuntimeError(f"${VENV_ENV}={given} has no bin/python; unset it to let the tests build one")
        return python
    target = default_venv(snapshot)
    requirements = target.with_name(target.name + "-requirements.txt")
    requirements.parent.mkdir(parents=True, exist_ok=True)
    requirements.write_text("\n".join(_requirements(snapshot)) + "\n")
    return cached_venv(target, [list(TORCH_PINS), ["-r", str(requirements)], list(EXTRA_PACKAGES)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", type=Path, default=None, help="ComfyUI source folder")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    snapshot = args.snapshot or snapshot_dir()
    problem = snapshot_problem(snapshot)
    if problem:
        raise SystemExit(problem)
    t0 = time.monotonic()
    python = ensure_venv(snapshot)
    print(f"{python} ready ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
