"""The node pack as ComfyUI sees it: the node classes it registers, an import that pulls in no torch, and
the bridge to ComfyUI doing nothing when ComfyUI is absent."""

from __future__ import annotations

import sys

import pytest
import torch
from pack_import import ROOT, load_pack  # tests/ helper

from parallel_runtime.errors import JobCancelled

PACK = load_pack()
from dit_parallel_pack.nodes import NODE_CLASS_MAPPINGS  # noqa: E402
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402


def test_node_mappings_are_classic_nodes():
    assert set(NODE_CLASS_MAPPINGS) == set(PACK.NODE_DISPLAY_NAME_MAPPINGS)
    assert PACK.WEB_DIRECTORY == "./web"
    for cls in NODE_CLASS_MAPPINGS.values():
        assert cls.CATEGORY == "DiT Parallel"
        assert isinstance(cls.RETURN_TYPES, tuple) and callable(getattr(cls, cls.FUNCTION))
        spec = cls.INPUT_TYPES()
        for section in spec.values():
            for name, entry in section.items():
                assert "tooltip" in entry[1], f"{cls.__name__}.{name} has no tooltip"


def test_every_choice_input_is_a_list_so_comfyui_validates_it():
    """ComfyUI 0.3.64 checks a combo's value against its options only when they are a Python list
    (execution.validate_inputs): a tuple lets a workflow with an unknown choice run until it fails
    (tests/comfyui/test_comfyui_workflows.py asks ComfyUI's own validate_prompt)."""
    combos = 0
    for node, cls in NODE_CLASS_MAPPINGS.items():
        for section in cls.INPUT_TYPES().values():
            for name, entry in section.items():
                kind = entry[0]
                if isinstance(kind, str):
                    continue  # a type (INT, LATENT, ...), not a choice
                combos += 1
                assert isinstance(kind, list), f"{node}.{name}: choices are a {type(kind).__name__}"
                assert all(isinstance(c, str) for c in kind), f"{node}.{name}: {kind!r}"
    assert combos >= 10  # loader (model, family, layout, dtype, attention, vae, weights), LoRA, advanced, ...


def test_pack_import_is_light():
    import subprocess

    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('p', {str(ROOT / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(ROOT)!r}]); m = importlib.util.module_from_spec(spec); "
        "sys.modules['p'] = m; spec.loader.exec_module(m); "
        "print(sorted(k for k in ('torch', 'diffusers', 'transformers') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_bridge_without_comfyui_is_a_no_op():
    bridge = ComfyBridge()
    assert bridge.available() is False
    assert bridge.interrupted() is False
    bridge.progress_bar(10).update_absolute(3, 10, torch.zeros(4, 4, 3, dtype=torch.uint8))
    assert bridge.public_api() is None and bridge.lost() == {}  # nothing is "lost" without ComfyUI
    bridge.send_status({"type": "reset"})
    bridge.free_memory_for(["cuda:0"])
    bridge.on_free_requested(lambda: None)
    bridge.on_memory_needed(lambda device: None)
    with pytest.raises(JobCancelled):
        bridge.raise_interrupted(JobCancelled("x"))
