"""dit-parallel: one Flux.1, FLUX.2, SD3, PixArt, Qwen-Image or Wan 2.1/2.2 generation on several GPUs, from ComfyUI.

ComfyUI imports this file from custom_nodes/. It stays light: the nodes import torch and the
worker runtime only when they run. Relative imports only (ComfyUI has its own ``nodes`` module).
"""

import importlib.util
import logging
import os
import sys


def _runtime_from_this_folder() -> None:
    """Make ``parallel_runtime`` (the engine, beside this file) importable without installing it:
    ComfyUI-Manager and a plain ``git clone`` only install requirements.txt. The worker processes
    find it too: the pool puts this folder on their PYTHONPATH. ``pip install -e .`` installs this
    same folder, so both ways import one copy."""
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.join(here, "parallel_runtime")
    loaded = sys.modules.get("parallel_runtime")
    if loaded is not None:
        where = os.path.dirname(os.path.abspath(getattr(loaded, "__file__", "") or package))
        if where != package:
            logging.getLogger("dit_parallel").warning(
                "dit-parallel: parallel_runtime was already imported from %s, not from %s; remove the other copy "
                "(pip uninstall dit-parallel) if nodes and workers disagree",
                where,
                package,
            )
        return
    spec = importlib.util.spec_from_file_location(
        "parallel_runtime", os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["parallel_runtime"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["parallel_runtime"]
        raise


WEB_DIRECTORY = "./web"

if __package__:  # ComfyUI imports this folder as a package; pytest may run this file alone (its rootdir's __init__)
    _runtime_from_this_folder()

    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
    from .nodes.context import install_web_routes

    install_web_routes()  # the status panel's HTTP routes; a no-op (one log line) outside ComfyUI

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
