"""Start ComfyUI's main.py as a later ComfyUI might be: the internals the pack reaches renamed away.

    python without_hooks.py /path/to/ComfyUI/main.py <main.py's arguments>

Just before ComfyUI loads its custom nodes (``nodes.init_extra_nodes``), every internal the pack's bridge uses
that this test graph's own ComfyUI code does not need is renamed (``<name>_renamed``), as an update would rename
it: ``comfy.utils.ProgressBar``, ``comfy.model_management``'s ``processing_interrupted`` / ``free_memory`` /
``get_free_memory`` / ``unload_all_models``, ``comfy.cli_args.args.preview_method``. ComfyUI's modules that
bound a name earlier keep it (as in a renamed world). Not renamed: what ComfyUI itself calls while it runs this
graph (the prompt queue, the interrupt exception, ``folder_paths``, the server), and ``comfy_api``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
from pathlib import Path

RENAMED = {
    "comfy.utils": ("ProgressBar",),
    "comfy.model_management": ("processing_interrupted", "free_memory", "get_free_memory", "unload_all_models"),
    "comfy.cli_args": ("args.preview_method",),
}


def rename_hooks() -> None:
    for module_name, names in RENAMED.items():
        module = sys.modules[module_name]
        for dotted in names:
            *parents, name = dotted.split(".")
            owner = module
            for parent in parents:
                owner = getattr(owner, parent)
            setattr(owner, f"{name}_renamed", getattr(owner, name))
            delattr(owner, name)
    print(f"without_hooks: renamed {sorted(f'{m}.{n}' for m, ns in RENAMED.items() for n in ns)}", flush=True)


class _AfterComfyNodes(importlib.abc.MetaPathFinder):
    """When ComfyUI's top-level ``nodes`` module is imported, wrap its ``init_extra_nodes`` so the hooks are
    renamed right before custom nodes load."""

    def find_spec(self, name, path, target=None):
        if name != "nodes":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            original = module.init_extra_nodes

            async def init_extra_nodes(*args, **kwargs):
                rename_hooks()
                return await original(*args, **kwargs)

            module.init_extra_nodes = init_extra_nodes

        spec.loader.exec_module = exec_module
        return spec


if __name__ == "__main__":
    main = Path(sys.argv[1]).resolve()
    sys.argv = [str(main), *sys.argv[2:]]
    sys.path[0] = str(main.parent)  # as `python main.py` has it (not this file's folder)
    sys.meta_path.insert(0, _AfterComfyNodes())
    runpy.run_path(str(main), run_name="__main__")
