"""Every workflows/*.json (UI format) is loadable: known node types, matching links, valid widgets.

Our node specs come from the pack's INPUT_TYPES; ComfyUI's core nodes used by the workflows are
written down below from ComfyUI's nodes.py / comfy_extras (ComfyUI cannot be installed in CI).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from pack_import import ROOT, load_pack  # tests/ helper

WORKFLOWS = sorted((ROOT / "workflows").glob("*.json"))
MAX_RES = 16384  # nodes.MAX_RESOLUTION
FILES = "FILES"  # a combo filled from the user's model folders: any file name is fine here
SEED_NAMES = ("seed", "noise_seed")
CONTROL_VALUES = ("fixed", "increment", "decrement", "randomize")


def _int(default: int, lo: int, hi: int, step: int = 1) -> tuple[str, dict[str, int]]:
    return ("INT", {"default": default, "min": lo, "max": hi, "step": step})


def _float(default: float, lo: float, hi: float) -> tuple[str, dict[str, float]]:
    return ("FLOAT", {"default": default, "min": lo, "max": hi})


# ComfyUI core nodes: type -> (inputs in INPUT_TYPES order, RETURN_TYPES)
CORE_NODES: dict[str, tuple[list[tuple[str, Any]], tuple[str, ...]]] = {
    "CLIPTextEncode": ([("text", ("STRING", {"multiline": True})), ("clip", ("CLIP",))], ("CONDITIONING",)),
    "VAELoader": ([("vae_name", (FILES,))], ("VAE",)),
    "VAEDecode": ([("samples", ("LATENT",)), ("vae", ("VAE",))], ("IMAGE",)),
    "VAEEncode": ([("pixels", ("IMAGE",)), ("vae", ("VAE",))], ("LATENT",)),
    "EmptyLatentImage": (
        [("width", _int(512, 16, MAX_RES, 8)), ("height", _int(512, 16, MAX_RES, 8)), ("batch_size", _int(1, 1, 4096))],
        ("LATENT",),
    ),
    "EmptySD3LatentImage": (  # comfy_extras/nodes_sd3.py
        [
            ("width", _int(1024, 16, MAX_RES, 16)),
            ("height", _int(1024, 16, MAX_RES, 16)),
            ("batch_size", _int(1, 1, 4096)),
        ],
        ("LATENT",),
    ),
    "LatentUpscale": (
        [
            ("samples", ("LATENT",)),
            ("upscale_method", (["nearest-exact", "bilinear", "area", "bicubic", "bislerp"],)),
            ("width", _int(512, 0, MAX_RES, 8)),
            ("height", _int(512, 0, MAX_RES, 8)),
            ("crop", (["disabled", "center"],)),
        ],
        ("LATENT",),
    ),
    "LatentUpscaleBy": (
        [
            ("samples", ("LATENT",)),
            ("upscale_method", (["nearest-exact", "bilinear", "area", "bicubic", "bislerp"],)),
            ("scale_by", _float(1.5, 0.01, 8.0)),
        ],
        ("LATENT",),
    ),
    "ImageScaleBy": (
        [
            ("image", ("IMAGE",)),
            ("upscale_method", (["nearest-exact", "bilinear", "area", "bicubic", "lanczos"],)),
            ("scale_by", _float(1.0, 0.01, 8.0)),
        ],
        ("IMAGE",),
    ),
    "SaveImage": ([("images", ("IMAGE",)), ("filename_prefix", ("STRING", {}))], ()),
    "PreviewImage": ([("images", ("IMAGE",))], ()),
    "DualCLIPLoader": (
        [
            ("clip_name1", (FILES,)),
            ("clip_name2", (FILES,)),
            ("type", (["sdxl", "sd3", "flux", "hunyuan_video", "hidream", "hunyuan_image"],)),
        ],
        ("CLIP",),
    ),
    "FluxGuidance": ([("conditioning", ("CONDITIONING",)), ("guidance", _float(3.5, 0.0, 100.0))], ("CONDITIONING",)),
    "ConditioningZeroOut": ([("conditioning", ("CONDITIONING",))], ("CONDITIONING",)),
}
FRONTEND_ONLY = {"Note", "MarkdownNote"}  # UI annotations, never sent to the server
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
DYNAMIC = {("DiTParallelModelLoader", "model"), ("DiTParallelModelLoader", "vae")}  # list the user's model folders


def node_specs() -> dict[str, tuple[list[tuple[str, Any]], tuple[str, ...]]]:
    specs = dict(CORE_NODES)
    for type_name, cls in load_pack().NODE_CLASS_MAPPINGS.items():
        inputs = cls.INPUT_TYPES()
        entries = [*inputs.get("required", {}).items(), *inputs.get("optional", {}).items()]
        specs[type_name] = ([(n, e) for n, e in entries], tuple(cls.RETURN_TYPES))
    return specs


def is_widget(entry: tuple) -> bool:
    kind = entry[0]
    return isinstance(kind, (list, tuple)) or kind in WIDGET_TYPES or kind == FILES


def check_widget(where: str, type_name: str, name: str, entry: tuple, value: Any) -> None:
    kind, opts = entry[0], (entry[1] if len(entry) > 1 else {})
    if kind == FILES or (type_name, name) in DYNAMIC:
        assert isinstance(value, str) and value, f"{where}: {name} must name a file, got {value!r}"
    elif isinstance(kind, (list, tuple)):
        assert value in kind, f"{where}: {name}={value!r} is not one of {list(kind)}"
    elif kind == "INT":
        assert isinstance(value, int) and not isinstance(value, bool), f"{where}: {name}={value!r} is not an int"
        assert opts.get("min", -(2**63)) <= value <= opts.get("max", 2**64), f"{where}: {name}={value} out of range"
        step = opts.get("step", 1)
        if step > 1 and name in ("width", "height"):
            assert value % step == 0, f"{where}: {name}={value} is not a multiple of {step}"
    elif kind == "FLOAT":
        assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{where}: {name}={value!r}"
        assert opts.get("min", float("-inf")) <= value <= opts.get("max", float("inf")), f"{where}: {name}={value}"
    elif kind == "STRING":
        assert isinstance(value, str), f"{where}: {name}={value!r} is not a string"
    elif kind == "BOOLEAN":
        assert isinstance(value, bool), f"{where}: {name}={value!r} is not a bool"


def widget_names(type_name: str, inputs: list[tuple[str, Any]]) -> list[tuple[str, tuple | None]]:
    """Widget values in the order the frontend saves them (a seed gets its control value after it)."""
    out: list[tuple[str, tuple | None]] = []
    for name, entry in inputs:
        if is_widget(entry):
            out.append((name, entry))
            opts = entry[1] if len(entry) > 1 else {}
            if entry[0] == "INT" and (name in SEED_NAMES or opts.get("control_after_generate")):
                out.append(("control_after_generate", None))
    return out


@pytest.fixture(scope="module")
def specs():
    return node_specs()


def test_there_are_workflows():
    names = {p.name for p in WORKFLOWS}
    assert len(names) >= 4, names


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid(path: Path, specs, monkeypatch):
    data = json.loads(path.read_text(encoding="utf-8"))
    nodes = {n["id"]: n for n in data["nodes"]}
    assert len(nodes) == len(data["nodes"]), "duplicate node ids"
    assert data["last_node_id"] >= max(nodes) and data["last_link_id"] >= max((l[0] for l in data["links"]), default=0)
    links = {l[0]: l for l in data["links"]}
    for node in data["nodes"]:
        where = f"{path.name} node {node['id']} ({node['type']})"
        if node["type"] in FRONTEND_ONLY:
            continue
        assert node["type"] in specs, f"{where}: unknown node type"
        inputs, returns = specs[node["type"]]
        # link slots: every non-widget input, in order, with its type
        slots = [(n, e) for n, e in inputs if not is_widget(e)]
        assert [(i["name"], i["type"]) for i in node.get("inputs", []) if "widget" not in i] == [
            (n, e[0]) for n, e in slots
        ], f"{where}: input slots differ from INPUT_TYPES"
        required = {n for n, _ in (specs[node["type"]][0])} - _optional(node["type"])
        for slot in node.get("inputs", []):
            if slot["name"] in required:
                assert slot["link"] is not None, f"{where}: required input {slot['name']} is not connected"
        assert [o["type"] for o in node.get("outputs", [])] == list(returns), f"{where}: outputs differ"
        # widgets
        names = widget_names(node["type"], inputs)
        values = node.get("widgets_values", [])
        assert len(values) == len(names), f"{where}: {len(values)} widget values for {[n for n, _ in names]}"
        for (name, entry), value in zip(names, values):
            if entry is None:
                assert value in CONTROL_VALUES, f"{where}: control_after_generate={value!r}"
            else:
                check_widget(where, node["type"], name, entry, value)
    # links join an output to an input of the same type
    for lid, origin, oslot, target, tslot, ltype in data["links"]:
        src, dst = nodes[origin], nodes[target]
        out_type = src["outputs"][oslot]["type"]
        in_slot = dst["inputs"][tslot]
        assert in_slot["link"] == lid and lid in (src["outputs"][oslot]["links"] or [])
        assert out_type == ltype and in_slot["type"] in (ltype, "*"), f"{path.name} link {lid}: {out_type} -> {in_slot}"
    for node in data["nodes"]:
        for slot in node.get("inputs", []):
            assert slot["link"] is None or slot["link"] in links, f"{path.name}: dangling link {slot['link']}"
    _check_our_validation(path, data, specs, monkeypatch)


def _optional(type_name: str) -> set[str]:
    cls = load_pack().NODE_CLASS_MAPPINGS.get(type_name)
    return set(cls.INPUT_TYPES().get("optional", {})) if cls else set()


def _check_our_validation(path: Path, data: dict, specs, monkeypatch) -> None:
    """Run our nodes' VALIDATE_INPUTS on the saved widget values (as ComfyUI does before a run),
    on an imagined machine with 8 GPUs."""
    import inspect

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    classes = load_pack().NODE_CLASS_MAPPINGS
    for node in data["nodes"]:
        cls = classes.get(node["type"])
        if cls is None or not hasattr(cls, "VALIDATE_INPUTS"):
            continue
        names = widget_names(node["type"], specs[node["type"]][0])
        values = {n: v for (n, e), v in zip(names, node["widgets_values"]) if e is not None}
        wanted = inspect.signature(cls.VALIDATE_INPUTS).parameters
        if "input_types" in wanted:
            continue
        result = cls.VALIDATE_INPUTS(**{k: values[k] for k in wanted})
        assert result is True, f"{path.name} node {node['id']} ({node['type']}): {result}"


def test_workflows_cover_the_layouts():
    loaders = {}
    core_used = set()
    for path in WORKFLOWS:
        data = json.loads(path.read_text(encoding="utf-8"))
        for node in data["nodes"]:
            if node["type"] == "DiTParallelModelLoader":
                v = node["widgets_values"]
                loaders[path.name] = dict(family=v[1], layout=v[3], ulysses=v[4], ring=v[5], cfg=v[6], pp=v[7])
            elif node["type"] in CORE_NODES:
                core_used.add(node["type"])
    flux = [l for l in loaders.values() if l["family"] == "flux" and l["layout"] == "manual"]
    sd3 = [l for l in loaders.values() if l["family"] == "sd3" and l["layout"] == "manual"]
    pixart = [l for l in loaders.values() if l["family"] == "pixart" and l["layout"] == "manual"]
    assert any(l["ulysses"] > 1 for l in flux), "a Flux workflow with Ulysses"
    assert any(l["cfg"] == 2 and l["pp"] > 1 for l in sd3), "an SD3 workflow with CFG parallel and PipeFusion"
    assert any(l["pp"] > 1 for l in pixart), "a PixArt workflow with PipeFusion"
    assert {"VAEDecode", "VAEEncode", "LatentUpscaleBy"} <= core_used, (
        "second passes through ComfyUI's VAE/latent nodes"
    )


def test_sampler_names_match_comfyui_kSampler_names():
    """Our combos use ComfyUI's spelling, so KSampler settings carry over (subset of comfy.samplers)."""
    comfy_samplers = {"euler", "euler_ancestral", "heun", "dpm_2", "dpmpp_2m", "dpmpp_2m_sde", "ddim", "lcm"}
    comfy_schedulers = {"simple", "sgm_uniform", "karras", "exponential", "ddim_uniform", "beta", "normal"}
    cls = load_pack().NODE_CLASS_MAPPINGS["DiTParallelSampler"]
    required = cls.INPUT_TYPES()["required"]
    assert set(required["sampler_name"][0]) <= comfy_samplers | {"dpmpp_sde", "uni_pc"}
    assert set(required["scheduler"][0]) <= comfy_schedulers


# -- running a workflow file end to end (tiny model, real runtime) ---------------------------------
SINKS = {"SaveImage", "PreviewImage"}


def run_ui_workflow(data: dict, context, widget_overrides: dict[str, dict[str, Any]]) -> dict[int, Any]:
    """Execute a UI-format workflow made of our nodes (+ image sinks) in its saved order.
    ``widget_overrides``: node type -> {input name: value} (to keep test runs small)."""
    import inspect

    classes = load_pack().NODE_CLASS_MAPPINGS
    specs = node_specs()
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
        names = widget_names(node["type"], specs[node["type"]][0])
        for (name, entry), value in zip(names, node["widgets_values"]):
            if entry is not None:
                kwargs[name] = value
        kwargs.update(widget_overrides.get(node["type"], {}))
        if node["type"] in SINKS:
            outputs[node["id"]] = (kwargs["images"],)
            continue
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
