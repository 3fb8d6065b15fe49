"""The pack's one node declaration in both of ComfyUI's forms, asked of the real ComfyUI 0.3.64: the classic form
it registers there by itself, and ComfyUI's public API form (comfy_api io.ComfyNode), forced, which publishes the
same nodes (same inputs, widget order, defaults, outputs) so every shipped workflow loads and validates alike.

Why classic on 0.3.64: its validator checks a choice's value only when the options are a list, which a
public-API combo is not there (an unknown choice passes validation); the pack asks ComfyUI's validator that
question at start (nodes/bridge.py ``validates_public_combos``) and keeps the classic form where the answer is no.
"""

from __future__ import annotations

import pytest
from conftest import WORKFLOWS

pytestmark = pytest.mark.timeout(2400)  # the session fixtures may build ComfyUI's venv first (minutes)

PUBLIC_DEFAULTS = {"multiselect": False, "multiline": False}  # what the public form spells out (the page's defaults)
COMPARED = ("input", "input_order", "output", "output_name", "output_node", "name", "display_name", "python_module")


def ours(info: dict) -> dict:
    return {name: node for name, node in info.items() if name.startswith("DiTParallel")}


def classic_entry(entry: list) -> list:
    """A public-API input entry as the classic form writes it (a combo: its options list as the type)."""
    kind, opts = entry[0], dict(entry[1]) if len(entry) > 1 else {}
    if kind == "COMBO":
        kind = opts.pop("options")
    for key, value in PUBLIC_DEFAULTS.items():
        if opts.get(key, value) == value:
            opts.pop(key, None)
    return [kind, opts]


def test_on_comfyui_0_3_64_the_pack_registers_the_classic_form(comfy_oracle, comfy_server):
    assert comfy_oracle["public_nodes"] == []
    assert "nodes in the classic form" in comfy_server.log_text()
    assert "does not check a public-API choice's value" in comfy_server.log_text()


def test_why_classic_an_unknown_choice_passes_the_public_forms_validation(comfy_oracle, comfy_public_oracle):
    """The finding the choice rests on, pinned: when a ComfyUI update starts checking public combos (as later
    ComfyUI versions do), this fails, and the pack's own question picks the public form there by itself."""
    assert comfy_oracle["choice_probe"] == {"valid": False, "errors": ["value_not_in_list"]}
    assert comfy_public_oracle["choice_probe"]["valid"] is True


def test_the_public_form_publishes_the_same_nodes(comfy_oracle, comfy_public_oracle):
    classic, public = ours(comfy_oracle["object_info"]), ours(comfy_public_oracle["object_info"])
    assert sorted(comfy_public_oracle["public_nodes"]) == sorted(classic) == sorted(public)
    for name, node in classic.items():
        other = dict(public[name])
        other["input"] = {  # (an output node's hidden prompt / extra_pnginfo: no widget, no socket; an empty
            section: {k: classic_entry(v) for k, v in entries.items()}  # "required": nothing either)
            for section, entries in other["input"].items()
            if section != "hidden" and entries
        }
        other["input_order"] = {k: v for k, v in other["input_order"].items() if k != "hidden" and v}
        for key in COMPARED:
            assert other.get(key) == node.get(key), f"{name}.{key}: the public form differs"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_validates_alike_in_the_public_form(path, comfy_oracle, comfy_public_oracle):
    classic, public = comfy_oracle["results"][path.name], comfy_public_oracle["results"][path.name]
    assert "conversion_error" not in public, public.get("conversion_error")
    assert public["prompt"] == classic["prompt"]  # the saved widget values land on the same inputs
    assert (public["valid"], public["node_errors"]) == (classic["valid"], classic["node_errors"])
