"""Every shipped workflow against the real ComfyUI: converted with the snapshot's node definitions
(core nodes and ours, as ComfyUI loads them) and validated by ``execution.validate_prompt`` itself,
with tiny models standing in for the files the workflows name (see conftest.TINY_STAND_INS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import WORKFLOWS
from workflow_api import FRONTEND_ONLY, is_widget, ordered_inputs, widget_slots

pytestmark = pytest.mark.timeout(2400)  # the session fixtures may build ComfyUI's venv first (minutes)


def test_there_are_workflows_and_the_oracle_loaded_the_pack(comfy_oracle):
    assert len(WORKFLOWS) >= 4
    assert comfy_oracle["loaded_pack"], comfy_oracle["log"][-4000:]
    assert set(comfy_oracle["results"]) == {p.name for p in WORKFLOWS}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_comfyuis_validate_prompt(path: Path, comfy_oracle):
    result = comfy_oracle["results"][path.name]
    assert "conversion_error" not in result, result.get("conversion_error")
    assert result["valid"] is True, json.dumps(
        {"error": result["error"], "node_errors": result["node_errors"]}, indent=1
    )
    assert not result["node_errors"]
    outputs = {k for k, v in result["prompt"].items() if v["class_type"] in ("SaveImage", "PreviewImage", "SaveVideo")}
    assert set(result["outputs"]) == outputs, "every image sink of the workflow would run"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_graph_matches_the_node_definitions(path: Path, comfy_oracle):
    """What the page reads from the file besides widget values: each node's input sockets and
    output types equal the definitions ComfyUI publishes, and links join matching slots."""
    info = comfy_oracle["object_info"]
    data = json.loads(path.read_text(encoding="utf-8"))
    nodes = {n["id"]: n for n in data["nodes"]}
    assert len(nodes) == len(data["nodes"]), "duplicate node ids"
    assert data["last_node_id"] >= max(nodes)
    assert data["last_link_id"] >= max((link[0] for link in data["links"]), default=0)
    for node in data["nodes"]:
        if node["type"] in FRONTEND_ONLY:
            continue
        where = f"{path.name} node {node['id']} ({node['type']})"
        assert node["type"] in info, f"{where}: ComfyUI has no such node"
        spec = info[node["type"]]
        sockets = [(n, e[0]) for n, e in ordered_inputs(spec) if not is_widget(e)]
        saved = [(i["name"], i["type"]) for i in node.get("inputs", []) if "widget" not in i]
        assert saved == sockets, f"{where}: input sockets differ from the definition"
        assert [o["type"] for o in node.get("outputs", [])] == list(spec["output"]), f"{where}: outputs differ"
        assert len(node.get("widgets_values", [])) == len(widget_slots(spec)), f"{where}: widget count"
    for lid, origin, oslot, target, tslot, ltype in data["links"]:
        out_slot, in_slot = nodes[origin]["outputs"][oslot], nodes[target]["inputs"][tslot]
        assert in_slot["link"] == lid and lid in (out_slot["links"] or []), f"{path.name} link {lid} is inconsistent"
        assert out_slot["type"] == ltype and in_slot["type"] in (ltype, "*"), f"{path.name} link {lid}: {ltype}"


def test_workflows_cover_the_layouts_and_mix_with_core_nodes(comfy_oracle):
    loaders, core_used, ours_used = [], set(), set()
    for path in WORKFLOWS:
        for node in comfy_oracle["results"][path.name]["prompt"].values():
            if node["class_type"] == "DiTParallelModelLoader":
                loaders.append(node["inputs"])
            if node["class_type"].startswith("DiTParallel"):
                ours_used.add(node["class_type"])
            else:
                core_used.add(node["class_type"])
    manual = [(l["family"], l) for l in loaders if l["layout"] == "manual"]
    assert any(f == "flux" and l["ulysses"] > 1 for f, l in manual), "a Flux workflow with Ulysses"
    assert any(f == "sd3" and l["cfg_parallel"] == 2 and l["pipefusion"] > 1 for f, l in manual), "SD3 CFG x PipeFusion"
    assert any(f == "pixart" and l["pipefusion"] > 1 for f, l in manual), "a PixArt workflow with PipeFusion"
    assert any(f == "wan" and l["ulysses"] > 1 for f, l in manual), "a Wan workflow with Ulysses"
    assert any(f == "wan" and l["ring"] > 1 for f, l in manual), "a Wan workflow with Ring"
    assert any(f == "wan" and l["cfg_parallel"] == 2 for f, l in manual), "a Wan workflow with CFG parallel"
    assert {"VAEDecode", "VAEEncode", "LatentUpscaleBy", "DualCLIPLoader", "CLIPTextEncode"} <= core_used
    edit = {"ReferenceLatent", "FluxKontextImageScale", "TextEncodeQwenImageEditPlus", "InpaintModelConditioning"}
    assert edit <= core_used, "the edit workflows take ComfyUI's own reference-image nodes"
    video = {"EmptyHunyuanLatentVideo", "WanImageToVideo", "Wan22ImageToVideoLatent", "CLIPVisionEncode", "SaveVideo"}
    assert video <= core_used, "the Wan workflows take ComfyUI's own video nodes"
    assert {"LTXVImgToVideo", "LTXVConditioning"} <= core_used, "LTX-Video image-to-video takes ComfyUI's own nodes"
    edit_text = {"DiTParallelTextEncodeQwenImageEdit", "DiTParallelTextEncodeQwenImageEditPlus"}
    assert edit_text <= ours_used, "a Qwen-Image-Edit workflow encodes its prompt and pictures on the workers"


def test_sampler_and_scheduler_names_are_comfyuis(comfy_oracle):
    """The sampler node offers ComfyUI's own lists (comfy.samplers.KSampler of the snapshot, same order),
    so KSampler settings carry over; and its defaults are ComfyUI KSampler's."""
    ours = comfy_oracle["object_info"]["DiTParallelSampler"]["input"]["required"]
    ksampler = comfy_oracle["object_info"]["KSampler"]["input"]["required"]
    assert ours["sampler_name"][0] == comfy_oracle["samplers"] == ksampler["sampler_name"][0]
    assert ours["scheduler"][0] == comfy_oracle["schedulers"] == ksampler["scheduler"][0]
    for name in ("seed", "steps", "sampler_name", "scheduler", "denoise"):
        assert default(ours[name]) == default(ksampler[name]), name


def default(entry: list) -> object:
    """A widget's initial value on the page: its default, else a combo's first option."""
    kind, opts = entry[0], (entry[1] if len(entry) > 1 else {})
    return opts.get("default", kind[0] if isinstance(kind, list) else None)


def test_comfyui_refuses_an_unknown_choice_of_every_choice_input(comfy_oracle):
    """ComfyUI's validate_prompt checks a combo's value only when its options are a list: an unknown
    family, layout, dtype, ... must be refused there, before the loader spends time loading."""
    probes = comfy_oracle["choice_probes"]
    expected = {"DiTParallelModelLoader." + n for n in ("model", "family", "layout", "dtype", "attention", "weights")}
    assert expected <= set(probes), sorted(probes)
    accepted = {k: v for k, v in probes.items() if v["valid"] or "value_not_in_list" not in v["errors"]}
    assert not accepted, accepted
