"""What travels between PipeFusion stages, and how it is packed.

Per item, stage ``s`` sends stage ``s + 1`` only the *dynamic* Activations fields: the image
hidden states of the patch, the conditioning vectors (small), and the text hidden states when
the text takes part in joint attention (they change in every block). Everything that depends
only on positions or on the prompt (rotary tables, the text mask, cross-attention text) is
*static*: it goes once per band at setup, in a :class:`ActivationFormat`, together with the shapes of
the dynamic fields, so every receive can be posted ahead with a buffer of the right size. The
dynamic fields of an item go as one flat tensor per dtype (normally one), plus, with a block cache, one
float32 flag the first stage sets for the stages after it (reuse the cached blocks for this item or not).
A tuple field (Wan VACE's ``control`` streams: the patch's control tokens, aligned with its image tokens)
travels as one field per element. A stage leaves out the fields no later block reads (an adapter's
``spent_fields(stop)``: Wan VACE's patch-embedded latent once the first hint block has run); they arrive as None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ..models.base import Activations

_META = ("grid", "txt_tokens", "ref_tokens", "control_scale")


def dynamic_fields(text_attention: str) -> tuple[str, ...]:
    """Activations fields sent with every item."""
    common = ("img", "temb", "temb_out", "control")
    return ("txt", *common) if text_attention == "joint" else common


def static_fields(text_attention: str) -> tuple[str, ...]:
    """Activations fields sent once per band (positions, prompt-only data)."""
    base = ("img_rope", "txt_rope", "txt_mask", "block_txt")
    return base if text_attention == "joint" else ("txt", *base)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    branch: int
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32" (names travel more safely than dtype objects)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclasses.dataclass(frozen=True)
class ActivationFormat:
    """How to rebuild the Activations of one band (one per CFG branch run separately)."""

    fields: tuple[FieldSpec, ...]  # dynamic fields in packing order
    static: tuple[dict[str, Any], ...]  # per branch: static fields + grid + txt_tokens
    flags: int = 0  # float32 values sent after the fields (the block cache's decision)

    @classmethod
    def from_activations(cls, acts: Sequence[Activations], text_attention: str, flags: int = 0) -> ActivationFormat:
        fields, static = [], []
        for b, a in enumerate(acts):
            for name in dynamic_fields(text_attention):
                value = getattr(a, name)
                parts = value if isinstance(value, tuple) else () if value is None else (value,)
                names = [f"{name}.{n}" for n in range(len(parts))] if isinstance(value, tuple) else [name]
                for part_name, t in zip(names, parts):
                    fields.append(FieldSpec(b, part_name, tuple(t.shape), str(t.dtype).removeprefix("torch.")))
            entry: dict[str, Any] = {n: getattr(a, n) for n in _META}
            for name in static_fields(text_attention):
                value = getattr(a, name)
                entry[name] = _to_cpu(value)
            static.append(entry)
        return cls(tuple(fields), tuple(static), flags)

    def without(self, names: Sequence[str]) -> ActivationFormat:
        """This format less the dynamic fields ``names`` (e.g. "control.0")."""
        return dataclasses.replace(self, fields=tuple(f for f in self.fields if f.name not in names))

    # -- wire form (plain containers, for send_object) ---------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        wire = {"fields": [dataclasses.astuple(f) for f in self.fields], "static": list(self.static)}
        return {**wire, "flags": self.flags}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> ActivationFormat:
        fields = tuple(FieldSpec(int(b), str(n), tuple(int(x) for x in s), str(d)) for b, n, s, d in wire["fields"])
        return cls(fields, tuple(wire["static"]), int(wire.get("flags", 0)))

    # -- packing -----------------------------------------------------------------------------------
    @property
    def dtypes(self) -> list[str]:
        seen: list[str] = []
        for f in self.fields:
            if f.dtype not in seen:
                seen.append(f.dtype)
        return seen

    def nbytes(self) -> int:
        return sum(f.numel * torch.empty(0, dtype=f.torch_dtype).element_size() for f in self.fields)

    def empty(self, device: torch.device) -> list[torch.Tensor]:
        """Receive buffers: one flat tensor per dtype (and the flags)."""
        bufs = [
            torch.empty(sum(f.numel for f in self.fields if f.dtype == d), dtype=getattr(torch, d), device=device)
            for d in self.dtypes
        ]
        return bufs + ([torch.empty(self.flags, dtype=torch.float32, device=device)] if self.flags else [])

    def pack(self, acts: Sequence[Activations], flags: Sequence[float] = ()) -> list[torch.Tensor]:
        """The dynamic fields of ``acts`` (one per branch) as flat tensors, one per dtype, and the ``flags``."""
        if len(flags) != self.flags:
            raise RuntimeError(f"PipeFusion item packed with {len(flags)} flags; the stage layout says {self.flags}")
        parts: dict[str, list[torch.Tensor]] = {d: [] for d in self.dtypes}
        for f in self.fields:
            t = _field(acts[f.branch], f.name)
            if t is None or tuple(t.shape) != f.shape or str(t.dtype).removeprefix("torch.") != f.dtype:
                got = None if t is None else (tuple(t.shape), str(t.dtype))
                raise RuntimeError(
                    f"PipeFusion stage output {f.name} (branch {f.branch}) is {got}, but the stage layout "
                    f"agreed at setup says {f.shape} {f.dtype}; a block changed the activation layout mid-pipeline"
                )
            parts[f.dtype].append(t.reshape(-1))
        flats = [torch.cat(parts[d]) if len(parts[d]) > 1 else parts[d][0].contiguous() for d in self.dtypes]
        if self.flags:
            device = flats[0].device if flats else None
            flats.append(torch.tensor([float(f) for f in flags], dtype=torch.float32, device=device))
        return flats

    def unpack_flags(self, flats: Sequence[torch.Tensor]) -> list[float]:
        """The flags of received flat tensors (empty without flags)."""
        return flats[-1].tolist() if self.flags else []

    def unpack(self, flats: Sequence[torch.Tensor], static: Sequence[dict[str, Any]]) -> list[Activations]:
        """Activations per branch from received flat tensors and the (device) static fields."""
        offsets = dict.fromkeys(self.dtypes, 0)
        flat_of = dict(zip(self.dtypes, flats))
        values: list[dict[str, Any]] = [dict(s) for s in static]
        for f in self.fields:
            at = offsets[f.dtype]
            values[f.branch][f.name] = flat_of[f.dtype][at : at + f.numel].view(f.shape)
            offsets[f.dtype] = at + f.numel
        out = []
        for v in values:
            v.setdefault("txt", None)
            for name in {n.split(".")[0] for n in v if "." in n}:  # a tuple field's elements, None if not sent
                count = 1 + max(int(n.split(".")[1]) for n in v if n.startswith(f"{name}."))
                v[name] = tuple(v.pop(f"{name}.{i}", None) for i in range(count))
            out.append(Activations(**v))
        return out

    def static_on(self, device: torch.device) -> list[dict[str, Any]]:
        """The static fields moved to ``device`` (do once per band and keep)."""
        return [{k: _to_device(v, device) for k, v in s.items()} for s in self.static]


def _field(acts: Activations, name: str) -> torch.Tensor | None:
    """A dynamic field's tensor: ``name``, or ``name.i`` for element i of a tuple field."""
    base, _, index = name.partition(".")
    value = getattr(acts, base)
    if not index:
        return value
    return value[int(index)] if value is not None and int(index) < len(value) else None


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return tuple(_to_device(v, device) for v in value)
    return value
