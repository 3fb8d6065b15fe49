"""Import the repository root as a package, the way ComfyUI imports a custom node folder."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK_NAME = "dit_parallel_pack"


def load_pack():
    """The repository root imported as the package ``dit_parallel_pack`` (once per process)."""
    if PACK_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACK_NAME, ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACK_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[PACK_NAME]
