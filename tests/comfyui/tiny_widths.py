"""Start ComfyUI's main.py so that its model detection reads a tiny Flux file's widths from the weights.

    python tiny_widths.py /path/to/ComfyUI/main.py <main.py's arguments>

ComfyUI 0.3.64 detects a Flux transformer (and a Flux ControlNet, whose config comes from the same detection)
from its tensor names, then fills in FLUX.1's widths (hidden 3072, 24 heads, text 4096, rope axes 16/56/56) as
constants. A tiny random test file has other widths, so here ``comfy.model_detection.detect_unet_config`` is
wrapped, as the module is first imported, to replace those constants by what the file's tensors show (hidden =
rows of ``img_in``, heads = hidden / the width of a query-norm scale, text = columns of ``txt_in``, the tiny
models' rope axes). A full-size file keeps ComfyUI's own values: only a config whose widths differ from its
weights is changed. Everything else is ComfyUI as shipped.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
from pathlib import Path

ROPE_AXES = {16: [4, 6, 6]}  # head width -> rope axes of the tiny Flux models (dit_devtools.tiny, tests/data)


def flux_widths(state_dict, prefix: str) -> dict:
    """The widths a Flux state dict's tensors show (empty when they are FLUX.1's own)."""
    hidden = state_dict[f"{prefix}img_in.weight"].shape[0]
    head = state_dict[f"{prefix}double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
    if hidden == 3072 and head == 128:
        return {}
    return {
        "hidden_size": hidden,
        "num_heads": hidden // head,
        "context_in_dim": state_dict[f"{prefix}txt_in.weight"].shape[1],
        "axes_dim": list(ROPE_AXES[head]),
    }


def wrap_detection(module) -> None:
    detect = module.detect_unet_config

    def detect_unet_config(state_dict, key_prefix, metadata=None):
        config = detect(state_dict, key_prefix, metadata=metadata)
        if config is not None and config.get("image_model") == "flux" and f"{key_prefix}img_in.weight" in state_dict:
            config.update(flux_widths(state_dict, key_prefix))
        return config

    module.detect_unet_config = detect_unet_config
    print("tiny_widths: Flux detection reads the widths from the weights", flush=True)


class _OnDetectionImport(importlib.abc.MetaPathFinder):
    """When ``comfy.model_detection`` is imported (by ComfyUI itself, after it has parsed its arguments), wrap
    its ``detect_unet_config``."""

    def find_spec(self, name, path, target=None):
        if name != "comfy.model_detection":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            wrap_detection(module)

        spec.loader.exec_module = exec_module
        return spec


if __name__ == "__main__":
    main = Path(sys.argv[1]).resolve()
    sys.argv = [str(main), *sys.argv[2:]]
    sys.path[0] = str(main.parent)  # as `python main.py` has it (not this file's folder)
    sys.meta_path.insert(0, _OnDetectionImport())
    runpy.run_path(str(main), run_name="__main__")
