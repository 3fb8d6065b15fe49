"""ComfyUI made importable for the reference generators in this folder (make_comfy_*_reference.py).

Run with the Python that imports ComfyUI; never imported by the test suite. Puts the ComfyUI checkout
on ``sys.path``, parses its command line as ``--cpu`` (plus ``--base-directory`` for a private
models/output tree), optionally stands MagicMock modules in for optional packages that are missing
(torchvision, av, ...: code paths the generators never run), and never writes ``__pycache__`` into
the checkout. Also the one JSON form every generator stores tensors in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from unittest import mock

import torch

OPTIONAL_IMPORTS = ("torchvision", "av", "torchaudio", "kornia", "spandrel", "soundfile", "comfyui_frontend_package")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import missing optional packages as MagicMock modules."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock()
        module.__path__, module.__name__, module.__spec__ = [], spec.name, spec
        return module

    def exec_module(self, module):
        pass


def prepare_comfy(comfy_dir: Path, base_dir: Path | None = None, stub_missing: bool = True) -> list[str]:
    """Make ``import comfy...`` work on the CPU (see the module doc); returns the names stubbed."""
    sys.dont_write_bytecode = True  # never write __pycache__ into the ComfyUI checkout
    missing = {n for n in OPTIONAL_IMPORTS if importlib.util.find_spec(n) is None} if stub_missing else set()
    if missing:
        sys.meta_path.insert(0, _StubFinder(missing))
    sys.path.insert(0, str(comfy_dir))
    sys.argv = [sys.argv[0], "--cpu"] + (["--base-directory", str(base_dir)] if base_dir is not None else [])
    import comfy.options

    comfy.options.enable_args_parsing()
    return sorted(missing)


def tensor_json(t: torch.Tensor, digits: int = 9) -> dict:
    """A tensor as {"shape", "data"}, each value printed with ``digits`` significant digits."""
    t = t.detach().cpu().float()
    return {"shape": list(t.shape), "data": [float(f"{v:.{digits}g}") for v in t.flatten().tolist()]}
