"""UI-format workflow (what the ComfyUI page saves) -> API-format prompt (what POST /prompt takes).

The page does this conversion itself before it queues a graph; here it is done from the node
definitions the server publishes (``/object_info``, or the same dict built in-process), following
the front-end's rules: an input is a widget when its type is a combo or INT/FLOAT/STRING/BOOLEAN
(unless ``forceInput``); widget values are saved in input order; an INT named seed/noise_seed (or
with ``control_after_generate``) saves one more value after it (fixed/increment/...), which the
API format drops; a widget turned into a socket takes its link instead. Pure standard library: it
runs in the test venv and in the ComfyUI venv alike.
"""

from __future__ import annotations

from typing import Any

WIDGET_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})
SEED_NAMES = ("seed", "noise_seed")
FRONTEND_ONLY = frozenset({"Note", "MarkdownNote", "Reroute", "PrimitiveNode"})  # never sent to the server
MODE_ALWAYS = 0


def _spec(entry: Any) -> tuple[Any, dict[str, Any]]:
    kind = entry[0] if isinstance(entry, (list, tuple)) and entry else entry
    opts = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 and isinstance(entry[1], dict) else {}
    return kind, opts


def is_widget(entry: Any) -> bool:
    kind, opts = _spec(entry)
    if opts.get("forceInput"):
        return False
    return isinstance(kind, (list, tuple)) or kind in WIDGET_TYPES


def has_control_value(name: str, entry: Any) -> bool:
    """Whether the page saves a control_after_generate value after this widget."""
    kind, opts = _spec(entry)
    return kind == "INT" and bool(opts.get("control_after_generate") or name in SEED_NAMES)


def ordered_inputs(info: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, spec) of a node definition's inputs in the order the page builds them."""
    inputs = info.get("input", {})
    order = info.get("input_order") or {k: list(v) for k, v in inputs.items()}
    out = []
    for section in ("required", "optional"):
        for name in order.get(section, []):
            if name in inputs.get(section, {}):
                out.append((name, inputs[section][name]))
    return out


def widget_slots(info: dict[str, Any]) -> list[tuple[str, Any | None]]:
    """(name, spec) per saved widget value; ("control_after_generate", None) for a control value."""
    out: list[tuple[str, Any | None]] = []
    for name, entry in ordered_inputs(info):
        if is_widget(entry):
            out.append((name, entry))
            if has_control_value(name, entry):
                out.append(("control_after_generate", None))
    return out


class WorkflowError(ValueError):
    """The workflow does not fit the node definitions (unknown type, wrong widget count, ...)."""


def ui_to_api(workflow: dict[str, Any], object_info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The API prompt of a UI-format ``workflow`` given the server's node definitions."""
    links = {link[0]: link for link in workflow.get("links", [])}
    prompt: dict[str, dict[str, Any]] = {}
    for node in workflow["nodes"]:
        if node["type"] in FRONTEND_ONLY or node.get("mode", MODE_ALWAYS) != MODE_ALWAYS:
            continue
        where = f"node {node['id']} ({node['type']})"
        info = object_info.get(node["type"])
        if info is None:
            raise WorkflowError(f"{where}: the server has no node type {node['type']!r}")
        slots = widget_slots(info)
        values = list(node.get("widgets_values") or [])
        if isinstance(node.get("widgets_values"), dict):
            raise WorkflowError(f"{where}: dict widgets_values are not supported")
        if len(values) != len(slots):
            raise WorkflowError(
                f"{where}: {len(values)} widget values saved but the node has {len(slots)} widgets "
                f"{[name for name, _ in slots]}"
            )
        inputs: dict[str, Any] = {}
        for (name, entry), value in zip(slots, values):
            if entry is not None:
                inputs[name] = value
        known = {name for name, _ in ordered_inputs(info)}
        for slot in node.get("inputs", []):
            if slot.get("link") is None:
                continue
            if slot["name"] not in known:
                raise WorkflowError(f"{where}: linked input {slot['name']!r} is not an input of {node['type']}")
            link = links.get(slot["link"])
            if link is None:
                raise WorkflowError(f"{where}: input {slot['name']!r} uses link {slot['link']}, which does not exist")
            _, origin, origin_slot, *_ = link
            inputs[slot["name"]] = [str(origin), int(origin_slot)]
        prompt[str(node["id"])] = {
            "class_type": node["type"],
            "inputs": inputs,
            "_meta": {"title": node.get("title") or info.get("display_name") or node["type"]},
        }
    return prompt
