"""The development tools beside the engine in a git checkout (``dit_devtools/``): the random-weight tiny
test models, the fault matrix, the training of ``tiny-flux-shapes``. They are not installed with the
package; the few engine features that use them (the built-in random ``tiny-*`` models, the benchmarks
on them, ``bench soak``'s fault matrix) find them next to ``parallel_runtime/``, or say what to do.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .errors import ConfigError

CHECKOUT_ROOT = Path(__file__).resolve().parent.parent  # the folder holding parallel_runtime/
DEVTOOLS = "dit_devtools"


def devtools_module(name: str, needed_for: str) -> ModuleType:
    """``dit_devtools.<name>``: the copy already imported (tests, worker processes), else the one beside
    this package, imported from its file (nothing is added to ``sys.path``).

    Raises ConfigError naming ``needed_for`` when this package is installed without a checkout."""
    if DEVTOOLS not in sys.modules:
        init = CHECKOUT_ROOT / DEVTOOLS / "__init__.py"
        if not init.is_file():
            raise ConfigError(
                f"{needed_for} needs dit-parallel's development tools ({DEVTOOLS}/), which are not in "
                f"{CHECKOUT_ROOT} beside this installed parallel_runtime",
                "the random-weight tiny models, the fault matrix and the training scripts live in the git "
                "checkout and are not part of the installed package",
                "use a git checkout of dit-parallel (the ComfyUI pack is one; `pip install -e .` there for the "
                "command line), or the shipped tiny-flux-shapes or a real model",
            )
        spec = importlib.util.spec_from_file_location(DEVTOOLS, init, submodule_search_locations=[str(init.parent)])
        package = importlib.util.module_from_spec(spec)
        sys.modules[DEVTOOLS] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules[DEVTOOLS]
            raise
    return importlib.import_module(f"{DEVTOOLS}.{name}")
