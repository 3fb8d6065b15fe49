"""A LoRA file's tensors grouped into patch modules (what each module changes and by what kind of patch).

A LoRA file is a flat dict: ``<module name><suffix>`` -> tensor. The suffix says the role of the tensor:
the up/down factors of a LoRA in any of the spellings trainers use (kohya ``lora_up/lora_down``, PEFT
``lora_A/lora_B``, old diffusers ``_lora.up``...), LyCORIS LoHa (``hada_*``) and LoKr (``lokr_*``) factors,
full differences (``diff``, ``diff_b``), replacements (``set_weight``), ``alpha`` and DoRA's ``dora_scale``.
The module name is what key resolution maps onto a model tensor. The roles and the precedence of the
kinds follow ComfyUI's loader (the reference for what a file means).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

Shape = tuple[int, ...]

# (suffix, role), longest first so that ".lora_B.weight" wins over ".lora_B".
_SUFFIXES: tuple[tuple[str, str], ...] = tuple(
    sorted(
        {
            ".lora_up.weight": "up",
            ".lora_down.weight": "down",
            ".lora_mid.weight": "mid",
            "_lora.up.weight": "up",
            "_lora.down.weight": "down",
            ".lora_B.weight": "up",
            ".lora_A.weight": "down",
            ".lora.up.weight": "up",
            ".lora.down.weight": "down",
            ".lora_B": "up",
            ".lora_A": "down",
            ".lora_linear_layer.up.weight": "up",
            ".lora_linear_layer.down.weight": "down",
            ".lora_B.default.weight": "up",
            ".lora_A.default.weight": "down",
            ".alpha": "alpha",
            ".dora_scale": "dora_scale",
            ".reshape_weight": "reshape_weight",
            ".hada_w1_a": "hada_w1_a",
            ".hada_w1_b": "hada_w1_b",
            ".hada_w2_a": "hada_w2_a",
            ".hada_w2_b": "hada_w2_b",
            ".hada_t1": "hada_t1",
            ".hada_t2": "hada_t2",
            ".lokr_w1": "lokr_w1",
            ".lokr_w2": "lokr_w2",
            ".lokr_w1_a": "lokr_w1_a",
            ".lokr_w1_b": "lokr_w1_b",
            ".lokr_w2_a": "lokr_w2_a",
            ".lokr_w2_b": "lokr_w2_b",
            ".lokr_t2": "lokr_t2",
            ".diff": "diff",
            ".diff_b": "diff_b",
            ".set_weight": "set_weight",
            ".w_norm": "w_norm",
            ".b_norm": "b_norm",
            ".a1.weight": "glora",
            ".a2.weight": "glora",
            ".b1.weight": "glora",
            ".b2.weight": "glora",
            ".oft_blocks": "oft",
            ".oft_diag": "oft",
            ".boft_blocks": "boft",
        }.items(),
        key=lambda item: -len(item[0]),
    )
)
UNSUPPORTED_KINDS: Mapping[str, str] = MappingProxyType(
    {"glora": "GLoRA", "oft": "OFT", "boft": "BOFT", "reshape_weight": "a weight-reshaping (BFL control) LoRA"}
)


@dataclasses.dataclass(frozen=True)
class Patch:
    """One patch of one model tensor: ``kind`` with its tensors (role -> key in the file)."""

    kind: str  # "lora" | "loha" | "lokr" | "diff" | "set"
    keys: Mapping[str, str]
    alpha: float | None
    shape: Shape  # the shape of the delta (must equal the patched tensor's)

    def scale(self, shapes: Mapping[str, Shape]) -> float:
        """ComfyUI's alpha / rank factor (1 when the file stores no alpha or no factor is low-rank)."""
        if self.alpha is None:
            return 1.0
        if self.kind == "lora":
            return self.alpha / shapes[self.keys["down"]][0]
        if self.kind == "loha":
            return self.alpha / shapes[self.keys["hada_w1_b"]][0]
        if self.kind == "lokr":
            rank = None
            if "lokr_w1" not in self.keys:
                rank = shapes[self.keys["lokr_w1_b"]][0]
            if "lokr_w2" not in self.keys:
                rank = shapes[self.keys["lokr_w2_b"]][0]
            return 1.0 if rank is None else self.alpha / rank
        return 1.0


@dataclasses.dataclass(frozen=True)
class Module:
    """The patches one module name of the file carries: on its weight and/or on its bias."""

    name: str
    weight: Patch | None
    bias: Patch | None
    unsupported: str | None  # a kind we recognise but do not apply (GLoRA, OFT, ...)
    keys: tuple[str, ...]  # every file key of the module


def split_key(key: str) -> tuple[str, str] | None:
    """(module name, role) of a file key; None when the suffix is not a LoRA role."""
    for suffix, role in _SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)], role
    return None


def group_modules(shapes: Mapping[str, Shape], alphas: Mapping[str, float]) -> tuple[list[Module], list[str]]:
    """The modules of a file (by name) and the keys that belong to none. ``alphas``: key -> value."""
    roles: dict[str, dict[str, str]] = {}
    stray: list[str] = []
    for key in shapes:
        parts = split_key(key)
        if parts is None:
            stray.append(key)
        else:
            roles.setdefault(parts[0], {})[parts[1]] = key
    modules = [_module(name, found, shapes, alphas) for name, found in roles.items()]
    return modules, stray


def _module(name: str, found: dict[str, str], shapes: Mapping[str, Shape], alphas: Mapping[str, float]) -> Module:
    alpha = alphas.get(found["alpha"]) if "alpha" in found else None
    weight = _adapter(found, shapes, alpha)
    # ComfyUI's precedence: w_norm, then diff, then set_weight replace an adapter on the weight.
    for role, kind in (("w_norm", "diff"), ("diff", "diff"), ("set_weight", "set")):
        if role in found:
            weight = Patch(kind, {"diff": found[role]}, None, shapes[found[role]])
    bias = None
    for role in ("b_norm", "diff_b"):
        if role in found and (role != "b_norm" or "w_norm" in found):
            bias = Patch("diff", {"diff": found[role]}, None, shapes[found[role]])
    unsupported = next((r for r in ("reshape_weight", "glora", "oft", "boft") if r in found), None)
    return Module(name, weight, bias, unsupported, tuple(found.values()))


def _adapter(found: dict[str, str], shapes: Mapping[str, Shape], alpha: float | None) -> Patch | None:
    def shape(role: str) -> Shape:
        return tuple(shapes[found[role]])

    picked = {r: found[r] for r in found if r not in ("alpha", "reshape_weight")}
    if "up" in found and "down" in found:
        keys = {r: picked[r] for r in ("up", "down", "mid", "dora_scale") if r in picked}
        up, down = shape("up"), shape("down")
        if "mid" in found:  # LoCon with a Tucker mid: [rank, rank, k, k]
            mid = shape("mid")
            delta: Shape = (up[0], down[1], *mid[2:])
        else:
            delta = (up[0], *down[1:])
        return Patch("lora", keys, alpha, delta)
    if "hada_w1_a" in found:
        keys = {r: picked[r] for r in picked if r.startswith("hada_") or r == "dora_scale"}
        rows = shape("hada_w1_a")[0] if "hada_t1" not in found else shape("hada_w1_a")[1]
        if "hada_t1" in found:
            t1 = shape("hada_t1")
            delta = (rows, shape("hada_w1_b")[1], *t1[2:])
        else:
            delta = (rows, shape("hada_w1_b")[1])
        return Patch("loha", keys, alpha, delta)
    if any(r.startswith("lokr_") for r in found):
        keys = {r: picked[r] for r in picked if r.startswith("lokr_") or r == "dora_scale"}
        return Patch("lokr", keys, alpha, _lokr_shape(found, shapes))
    return None


def _lokr_shape(found: dict[str, str], shapes: Mapping[str, Shape]) -> Shape:
    def factor(label: str) -> Shape:
        if f"lokr_{label}" in found:
            return tuple(shapes[found[f"lokr_{label}"]])
        a, b = tuple(shapes[found[f"lokr_{label}_a"]]), tuple(shapes[found[f"lokr_{label}_b"]])
        if label == "w2" and "lokr_t2" in found:  # Tucker: einsum over t2 [r, r, k, k]
            t2 = tuple(shapes[found["lokr_t2"]])
            return (a[1], b[1], *t2[2:])
        return (a[0], b[1])

    w1, w2 = factor("w1"), factor("w2")
    if len(w2) == 4:
        w1 = (*w1, 1, 1)
    return tuple(x * y for x, y in zip(w1, w2)) + tuple(w2[len(w1) :])


def numel(shape: Shape) -> int:
    return math.prod(shape)
