"""One declaration per node: its inputs (ComfyUI's types, choices as lists, limits, tooltips), outputs and
description, as data (:class:`NodeSpec`). ``DeclaredNode`` renders it in ComfyUI's classic form
(``INPUT_TYPES``, ``RETURN_TYPES``, ...); ``public_form.py`` renders the same declaration as a node of ComfyUI's
versioned public API (``comfy_api``'s ``io.ComfyNode`` schema). Nothing here imports ComfyUI.

A node class states ``SPEC`` and the method ``SPEC.function`` names; ``VALIDATE_INPUTS`` / ``IS_CHANGED``
(classmethods, when the node has them) serve both forms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from .context import ContextNode

CATEGORY = "DiT Parallel"
WIDGETS = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")
Options = Sequence[Any] | Callable[[], Sequence[Any]]


@dataclasses.dataclass(frozen=True)
class Input:
    """One input: a widget (INT, FLOAT, STRING, BOOLEAN, or COMBO with ``options``) or a socket of another
    type (LATENT, CONDITIONING, PARALLEL_MODEL, "*" for any)."""

    name: str
    type: str
    tooltip: str
    optional: bool = False
    default: Any = None
    min: float | None = None
    max: float | None = None
    step: float | None = None
    round: float | None = None
    options: Options | None = None  # COMBO: the choices, or a function listing them (files on disk)
    multiline: bool = False
    dynamic_prompts: bool = False
    control_after_generate: bool = False

    def choices(self) -> list[Any]:
        """A COMBO's options now, as a list (ComfyUI validates a combo's value only when its options are a list)."""
        options = self.options() if callable(self.options) else self.options
        return list(options or ())

    def settings(self) -> dict[str, Any]:
        """The widget settings ComfyUI reads (the classic form's second tuple item), without unset ones."""
        values = {
            "default": self.default,
            "min": self.min,
            "max": self.max,
            "step": self.step,
            "round": self.round,
            "multiline": self.multiline or None,
            "dynamicPrompts": self.dynamic_prompts or None,
            "control_after_generate": self.control_after_generate or None,
        }
        return {k: v for k, v in values.items() if v is not None} | {"tooltip": self.tooltip}

    def classic(self) -> tuple[Any, dict[str, Any]]:
        """``(type or options list, settings)`` as the classic INPUT_TYPES holds it."""
        return (self.choices() if self.type == "COMBO" else self.type), self.settings()


def Int(name: str, tooltip: str, default: int, low: int, high: int, **more: Any) -> Input:  # noqa: N802
    return Input(name, "INT", tooltip, default=default, min=low, max=high, **more)


def Float(name: str, tooltip: str, default: float, low: float, high: float, **more: Any) -> Input:  # noqa: N802
    return Input(name, "FLOAT", tooltip, default=default, min=low, max=high, **more)


def Choice(name: str, tooltip: str, options: Options, default: Any = None, **more: Any) -> Input:  # noqa: N802
    return Input(name, "COMBO", tooltip, default=default, options=options, **more)


def Socket(name: str, type_name: str, tooltip: str, optional: bool = False) -> Input:  # noqa: N802
    return Input(name, type_name, tooltip, optional=optional)


@dataclasses.dataclass(frozen=True)
class Output:
    type: str
    tooltip: str
    name: str | None = None  # the name on the node (None: the type, as ComfyUI shows it)


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """Everything ComfyUI shows of a node, and the method that runs it."""

    node_id: str  # the class type saved in workflows (never renamed)
    display_name: str
    description: str
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    function: str  # the node class's method that runs it
    output_node: bool = False
    category: str = CATEGORY

    def classic_inputs(self) -> dict[str, dict[str, Any]]:
        """INPUT_TYPES: required inputs, then optional ones, each in declared order (the widget order saved)."""
        out: dict[str, dict[str, Any]] = {}
        for section, optional in (("required", False), ("optional", True)):
            entries = {i.name: i.classic() for i in self.inputs if i.optional == optional}
            if entries:
                out[section] = entries
        return out


class DeclaredNode(ContextNode):
    """A node in ComfyUI's classic form, rendered from its class's ``SPEC``."""

    SPEC: ClassVar[NodeSpec]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("SPEC")
        if spec is None:
            return
        cls.RETURN_TYPES = tuple(o.type for o in spec.outputs)
        if any(o.name for o in spec.outputs):
            cls.RETURN_NAMES = tuple(o.name or o.type for o in spec.outputs)
        cls.OUTPUT_TOOLTIPS = tuple(o.tooltip for o in spec.outputs)
        cls.FUNCTION = spec.function
        cls.CATEGORY = spec.category
        cls.DESCRIPTION = spec.description
        cls.OUTPUT_NODE = spec.output_node

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, dict[str, Any]]:  # noqa: N802
        return cls.SPEC.classic_inputs()
