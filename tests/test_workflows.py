"""The tiny workflow file runs through our node classes with the real runtime, without ComfyUI.

Every workflows/*.json is validated against the real ComfyUI (its node definitions and
``execution.validate_prompt``) in tests/comfyui/test_comfyui_workflows.py.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from pack_import import ROOT, load_pack  # tests/ helper

FRONTEND_ONLY = {"Note", "MarkdownNote"}  # UI annotations, never sent to the server
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
SEED_NAMES = ("seed", "noise_seed")


def our_specs() -> dict[str, list[tuple[str, Any]]]:
    """type -> [(input name, INPUT_TYPES entry)] of the pack's nodes, in the page's order."""
    specs = {}
    for type_name, cls in load_pack().NODE_CLASS_MAPPINGS.items():
        inputs = cls.INPUT_TYPES()
        specs[type_name] = [*inputs.get("required", {}).items(), *inputs.get("optional", {}).items()]
    return specs


def widget_names(inputs: list[tuple[str, Any]]) -> list[tuple[str, tuple | None]]:
    """Widget values in the order the frontend saves them (a seed gets its control value after it)."""
    out: list[tuple[str, tuple | None]] = []
    for name, entry in inputs:
        if isinstance(entry[0], (list, tuple)) or entry[0] in WIDGET_TYPES:
            out.append((name, entry))
            opts = entry[1] if len(entry) > 1 else {}
            if entry[0] == "INT" and (name in SEED_NAMES or opts.get("control_after_generate")):
                out.append(("control_after_generate", None))
    return out


# -- running a workflow file end to end (tiny model, real runtime) ---------------------------------
SINKS = {"SaveImage", "PreviewImage"}


def run_ui_workflow(data: dict, context, widget_overrides: dict[str, dict[str, Any]]) -> dict[int, Any]:
    """Execute a UI-format workflow made of our nodes (+ image sinks) in its saved order.
    ``widget_overrides``: node type -> {input name: value} (to keep test runs small)."""
    import inspect

    classes = load_pack().NODE_CLASS_MAPPINGS
    specs = our_specs()
    links = {l[0]: l for l in data["links"]}
    outputs: dict[int, Any] = {}
    for node in sorted(data["nodes"], key=lambda n: n["order"]):
        if node["type"] in FRONTEND_ONLY:
            continue
        kwargs: dict[str, Any] = {}
        for slot in node.get("inputs", []):
            if slot["link"] is not None:
                _, origin, oslot, *_ = links[slot["link"]]
                kwargs[slot["name"]] = outputs[origin][oslot]
        if node["type"] in SINKS:
            outputs[node["id"]] = (kwargs["images"],)
            continue
        names = widget_names(specs[node["type"]])
        for (name, entry), value in zip(names, node["widgets_values"]):
            if entry is not None:
                kwargs[name] = value
        kwargs.update(widget_overrides.get(node["type"], {}))
        cls = classes[node["type"]]
        obj = cls(context=context) if "context" in inspect.signature(cls.__init__).parameters else cls()
        result = getattr(obj, cls.FUNCTION)(**kwargs)
        outputs[node["id"]] = result["result"] if isinstance(result, dict) else result
    return outputs


def test_tiny_smoke_workflow_runs(pool_registry):
    """The tiny-flux workflow file runs through our node classes with the real runtime (smaller
    size and fewer steps than saved, to stay quick), with the real bridge degrading without ComfyUI."""
    import torch

    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    data = json.loads((ROOT / "workflows" / "tiny_flux_cpu_smoke.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    overrides = {
        "DiTParallelEmptyLatent": {"width": 64, "height": 64},
        "DiTParallelSampler": {"steps": 2},
        "DiTParallelModelLoader": {"dtype": "fp32"},
    }
    outputs = run_ui_workflow(data, ctx, overrides)
    sink = next(n for n in data["nodes"] if n["type"] == "PreviewImage")
    (image,) = outputs[sink["id"]]
    assert isinstance(image, torch.Tensor) and image.shape == (1, 64, 64, 3)
    assert 0.0 <= float(image.min()) <= float(image.max()) <= 1.0


def test_the_trained_tiny_model_workflow_draws_its_prompt_as_saved(pool_registry):
    """workflows/tiny_flux_shapes_cpu.json run exactly as saved (the shipped trained model, Ulysses 2 on two CPU
    workers, 128 px, 12 steps, CFG 2) draws the green square on yellow its prompt asks for."""
    import numpy as np

    from dit_devtools.training.shapes_detector import detect

    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    data = json.loads((ROOT / "workflows" / "tiny_flux_shapes_cpu.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    sink = next(n for n in data["nodes"] if n["type"] == "PreviewImage")
    (image,) = run_ui_workflow(data, ctx, {})[sink["id"]]
    assert image.shape == (1, 128, 128, 3)
    found = detect(np.asarray(image[0].clamp(0, 1), dtype=np.float32))
    assert found.blobs, f"no shape found (background {found.background})"
    assert (found.background, found.blobs[0].colour, found.blobs[0].shape) == ("yellow", "green", "square")


def test_tiny_wan_smoke_workflow_runs(pool_registry):
    """The tiny Wan workflow file (Parallel Empty Latent with length 9 -> 5-D latent, UMT5 text encode on
    the workers, Ulysses 2) decodes into 9 frames, and equals the same graph on one CPU worker."""
    import torch

    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    data = json.loads((ROOT / "workflows" / "tiny_wan_cpu_smoke.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    sink = next(n for n in data["nodes"] if n["type"] == "PreviewImage")
    frames = {}
    for layout in ({}, {"devices": "cpu:1", "ulysses": 1}):
        overrides = {"DiTParallelSampler": {"steps": 2}, "DiTParallelModelLoader": layout}
        (frames[bool(layout)],) = run_ui_workflow(data, ctx, overrides)[sink["id"]]
    assert frames[False].shape == (9, 48, 64, 3)  # 1 + 4 * (3 latent frames - 1), at 8x the latent size
    torch.testing.assert_close(frames[False], frames[True], atol=2e-5, rtol=0)


def test_tiny_caches_workflow_runs(pool_registry):
    """The speed workflow (tiny-flux-shapes, Ulysses 2, Parallel Block Cache between loader and sampler) runs
    through our node classes and the sampler node reports what the cache reused (compiled blocks off here:
    tests/test_compiled_blocks.py covers them)."""
    context = importlib.import_module(f"{load_pack().__name__}.nodes.context")
    bridge = importlib.import_module(f"{load_pack().__name__}.nodes.bridge")
    sampler = importlib.import_module(f"{load_pack().__name__}.nodes.sampler")
    data = json.loads((ROOT / "workflows" / "tiny_flux_shapes_caches_cpu.json").read_text(encoding="utf-8"))
    ctx = context.NodeContext.create(registry=pool_registry, bridge=bridge.ComfyBridge())
    shown = []
    original = sampler.run_sampler

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        shown.append(out["ui"]["text"][0])
        return out

    sampler.run_sampler = recording
    try:
        outputs = run_ui_workflow(data, ctx, {"DiTParallelModelLoader": {"compile": "off"}})
    finally:
        sampler.run_sampler = original
    sink = next(n for n in data["nodes"] if n["type"] == "PreviewImage")
    (image,) = outputs[sink["id"]]
    assert image.shape == (1, 128, 128, 3)
    assert len(shown) == 1 and "block cache reused" in shown[0], shown
    reused = int(shown[0].split("block cache reused ")[1].split("/")[0])
    assert reused >= 5


def test_readme_lists_every_workflow_with_its_model_files():
    """README's *Example workflows* table names every workflows/*.json, and each row the model files the graph
    names (a built-in tiny model's row says so)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Example workflows", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    for path in sorted((ROOT / "workflows").glob("*.json")):
        (row,) = [r for r in rows if f"`{path.name}`" in r] or [None]
        assert row is not None, f"README's Example workflows table does not list {path.name}"
        data = json.loads(path.read_text(encoding="utf-8"))
        for node in data["nodes"]:
            if node["type"] in ("DiTParallelModelLoader", "DiTParallelLoraLoader", "DiTParallelControlNetLoader"):
                name = node["widgets_values"][0]
                named = name.startswith("tiny-") and "built in" in row
                assert named or name in row, f"README's row for {path.name} does not name {name}"
