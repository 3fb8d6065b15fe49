"""The nodes in ComfyUI's versioned public API (``comfy_api``'s ``io.ComfyNode`` schema), rendered from the same
declarations (``NodeSpec``) as the classic form, and the choice between the two forms.

``public_node(cls, io)`` makes an ``io.ComfyNode`` whose schema is ``cls.SPEC`` and whose ``execute`` runs
``cls`` (with the shared context) the way the classic form runs it; ``validate_inputs`` / ``fingerprint_inputs``
are the class's own ``VALIDATE_INPUTS`` / ``IS_CHANGED`` (same signatures, so ComfyUI checks the same inputs).

Which form: ``$DIT_PARALLEL_NODE_FORM`` = ``public`` / ``classic`` when set; else the public form where the
running ComfyUI offers it and its validator checks the public form's choice inputs (the bridge asks it):
ComfyUI 0.3.64 checks a combo's value only when its options are a list, which a public-API combo is not
there, so the nodes keep the classic form on it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .declare import DeclaredNode, Input, NodeSpec

log = logging.getLogger("dit_parallel.nodes")

FORM_ENV = "DIT_PARALLEL_NODE_FORM"
PUBLIC, CLASSIC = "public", "classic"
_WIDGETS = {"INT": "Int", "FLOAT": "Float", "STRING": "String", "BOOLEAN": "Boolean"}


def _input(io: Any, spec: Input) -> Any:
    """One declared input as an ``io`` input (the same settings the classic form gives)."""
    common = {"optional": spec.optional, "tooltip": spec.tooltip}
    if spec.type == "COMBO":
        return io.Combo.Input(spec.name, options=spec.choices(), default=spec.default, **common)
    if spec.type in ("INT", "FLOAT"):
        extra = {"min": spec.min, "max": spec.max, "step": spec.step, "default": spec.default}
        if spec.type == "FLOAT":
            extra["round"] = spec.round
        else:
            extra["control_after_generate"] = spec.control_after_generate or None
        return getattr(io, _WIDGETS[spec.type]).Input(spec.name, **common, **extra)
    if spec.type == "STRING":
        return io.String.Input(
            spec.name,
            default=spec.default,
            multiline=spec.multiline,
            dynamic_prompts=spec.dynamic_prompts or None,
            **common,
        )
    if spec.type == "BOOLEAN":
        return io.Boolean.Input(spec.name, default=spec.default, **common)
    kind = io.AnyType if spec.type == "*" else io.Custom(spec.type)
    return kind.Input(spec.name, **common)


def _schema(io: Any, spec: NodeSpec) -> Any:
    outputs = [io.Custom(o.type).Output(display_name=o.name, tooltip=o.tooltip) for o in spec.outputs]
    return io.Schema(
        node_id=spec.node_id,
        display_name=spec.display_name,
        category=spec.category,
        description=spec.description,
        inputs=[_input(io, i) for i in spec.inputs],
        outputs=outputs,
        is_output_node=spec.output_node,
    )


def _node_output(io: Any, result: Any) -> Any:
    """A classic return value (a tuple, or {"ui", "result"}) as ``io.NodeOutput``."""
    if isinstance(result, dict):
        return io.NodeOutput(*result.get("result", ()), ui=result.get("ui"))
    return io.NodeOutput(*(result or ()))


def public_node(cls: type[DeclaredNode], io: Any) -> type:
    """``cls`` as an ``io.ComfyNode`` (its name and declaration unchanged)."""
    spec = cls.SPEC

    def define_schema(node: type) -> Any:
        return _schema(io, spec)

    def execute(node: type, **inputs: Any) -> Any:
        return _node_output(io, getattr(cls(), spec.function)(**inputs))

    members: dict[str, Any] = {
        "define_schema": classmethod(define_schema),
        "execute": classmethod(execute),
        "__doc__": cls.__doc__,
        "__module__": cls.__module__,
        "CLASSIC": cls,
    }
    for classic, public in (("VALIDATE_INPUTS", "validate_inputs"), ("IS_CHANGED", "fingerprint_inputs")):
        if classic in vars(cls):
            members[public] = classmethod(vars(cls)[classic].__func__)
    return type(cls.__name__, (io.ComfyNode,), members)


def choose_form(bridge: Any) -> tuple[str, Any | None, str]:
    """(form, the public API module or None, why)."""
    wanted = os.environ.get(FORM_ENV, "").strip().lower()
    api = bridge.public_api() if wanted != CLASSIC else None
    if wanted == CLASSIC:
        return CLASSIC, None, f"{FORM_ENV}={CLASSIC}"
    if api is None:
        return CLASSIC, None, "ComfyUI's public node API (comfy_api io.ComfyNode) is not available"
    if wanted == PUBLIC:
        return PUBLIC, api, f"{FORM_ENV}={PUBLIC}"
    if bridge.validates_public_combos(api.io) is False:
        return (
            CLASSIC,
            None,
            (
                f"ComfyUI's public node API is there ({api.__name__}), but this ComfyUI does not check a public-API "
                "choice's value against its options (0.3.64 checks list-typed choices only)"
            ),
        )
    return PUBLIC, api, f"{api.__name__} offers io.ComfyNode and its validator checks choices"


def node_classes(classes: list[type[DeclaredNode]], bridge: Any) -> tuple[dict[str, type], str]:
    """{node id: the class ComfyUI registers} in the chosen form, and that form."""
    form, api, why = choose_form(bridge)
    if bridge.available():
        log.info("dit-parallel: nodes in the %s form (%s)", form, why)
    if form == PUBLIC:
        return {c.SPEC.node_id: public_node(c, api.io) for c in classes}, form
    return {c.SPEC.node_id: c for c in classes}, form
