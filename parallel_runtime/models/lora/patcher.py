"""Put a loaded model's weights in the state a LoRA stack asks for, and back, without reloading.

The unit of patching is a GROUP: one tensor of the original layout (a fused q/k/v projection is one group
of three diffusers tensors) or one tensor of a model without an original layout. For every group the
stack touches, the patcher keeps the loaded ("pristine") values in host memory the first time it changes
them, like ComfyUI's backup. A group is always recomputed FROM THE PRISTINE VALUES with every patch of
the stack in order, in fp32, and rounded once to the model's dtype (ComfyUI's ``calculate_weight``:
original-layout patches act on the whole tensor, diffusers-named ones on their rows). When every patch
of a group only mixes rows with the same rows (plain LoRA, diff, set), each diffusers tensor is patched
on its own rows, an fp32 one in place (pristine + first LoRA in one pass); otherwise (DoRA, LoHa, LoKr)
the group is gathered into one fp32 tensor in the original row order and scattered back. The same stack
therefore always gives the same bits, a group the stack no longer touches gets its pristine bytes back,
and only groups whose patch list changed are recomputed. Groups whose tensors this rank does not hold
(another PipeFusion stage's, on "meta") are skipped.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from ..base import COMPUTE_DTYPE_ATTR
from .files import LoraFileId, read_lora
from .gguf_patches import deferred_layers, patch_group
from .keymap import TRANSFORMER, ModelKeys, Target
from .patch_math import apply_patch, apply_patch_rows, row_separable
from .resolve import Resolution, ResolvedPatch, resolve
from .rounding import rounding_for
from .routing import Piece, Route

MAX_CACHED_FILES = 4  # LoRA files whose tensors a worker keeps between jobs


@dataclasses.dataclass(frozen=True)
class StackEntry:
    """One LoRA of a stack: the file and its strengths on the transformer and on the text encoders."""

    file: LoraFileId
    strength_model: float = 1.0
    strength_clip: float = 1.0

    def strength(self, space: str) -> float:
        return self.strength_model if space == TRANSFORMER else self.strength_clip


@dataclasses.dataclass(frozen=True)
class _Use:
    """One patch of a group at one strength, from one file of the stack."""

    strength: float
    file: LoraFileId
    patch: ResolvedPatch
    selector: str | None  # the diffusers tensor whose rows it patches (None: the whole group)


@dataclasses.dataclass
class _Loaded:
    resolution: Resolution
    tensors: dict[str, torch.Tensor]  # only what this rank's patches use


class LoraPatcher:
    """Patches the tensors of ``spaces`` (TRANSFORMER and text-encoder components -> modules)."""

    def __init__(self, keys: ModelKeys, spaces: Mapping[str, nn.Module]):
        self.keys = keys
        self.spaces = dict(spaces)
        self._params = {
            space: dict(module.named_parameters()) for space, module in self.spaces.items()
        }  # shapes, devices
        self._files: collections.OrderedDict[LoraFileId, _Loaded] = collections.OrderedDict()
        self._pristine: dict[tuple[str, str], torch.Tensor] = {}
        self._applied: dict[tuple[str, str], tuple] = {}

    # -- public ------------------------------------------------------------------------------------
    @property
    def pristine_bytes(self) -> int:
        """Host memory held for unpatching (the loaded values of every tensor the stack changed)."""
        return sum(t.numel() * t.element_size() for t in self._pristine.values())

    def resolution(self, file: LoraFileId) -> Resolution:
        return self._load(file).resolution

    def apply(self, stack: Sequence[StackEntry], spaces: Iterable[str]) -> dict[str, int]:
        """Make the tensors of ``spaces`` equal to their pristine values patched by ``stack`` (entries
        with strength 0 there change nothing). Returns counts of recomputed and restored groups."""
        spaces = [s for s in spaces if s in self.spaces]
        wanted: dict[tuple[str, str], list[_Use]] = {}
        signature: dict[tuple[str, str], list] = {}
        for entry in stack:
            loaded = None
            for space in spaces:
                strength = float(entry.strength(space))
                if strength == 0.0:
                    continue
                loaded = loaded or self._load(entry.file)
                for rp in loaded.resolution.patches:
                    if rp.target.space != space:
                        continue
                    route, selector = self._route(rp.target)
                    if not self._held(space, route):
                        continue
                    group = (space, route.original)
                    wanted.setdefault(group, []).append(_Use(strength, entry.file, rp, selector))
                    signature.setdefault(group, []).append((entry.file, strength, rp.module, rp.target.tensor))
        recomputed = restored = 0
        for group, patches in wanted.items():
            sig = tuple(signature[group])
            if self._applied.get(group) != sig:
                self._recompute(group, patches)
                self._applied[group] = sig
                recomputed += 1
        for group in [g for g in self._applied if g[0] in spaces and g not in wanted]:
            self._restore(group)
            restored += 1
        self._evict(keep={entry.file for entry in stack})
        return {"recomputed": recomputed, "restored": restored}

    # -- files -------------------------------------------------------------------------------------
    def _load(self, file: LoraFileId) -> _Loaded:
        if file in self._files:
            self._files.move_to_end(file)
            return self._files[file]
        tensors = read_lora(file)
        resolution = resolve(tensors, self.keys)
        used = set()
        for rp in resolution.patches:
            route, _ = self._route(rp.target)
            if rp.target.space in self.spaces and self._held(rp.target.space, route):
                used.update(rp.patch.keys.values())
        loaded = _Loaded(resolution, {k: tensors[k] for k in used})
        self._files[file] = loaded
        return loaded

    def _evict(self, keep: set[LoraFileId]) -> None:
        """Forget the least recently used files beyond MAX_CACHED_FILES (never those of the stack in use)."""
        for file in list(self._files):
            if len(self._files) <= MAX_CACHED_FILES:
                break
            if file not in keep:
                del self._files[file]

    # -- groups ------------------------------------------------------------------------------------
    def _route(self, target: Target) -> tuple[Route, str | None]:
        if target.space != TRANSFORMER:
            rows = target.shape[0] if target.shape else 1
            return Route(target.tensor, rows, (Piece(target.tensor, ((0, rows),)),)), None
        if target.original:
            return self.keys.routing.routes[target.tensor], None
        return self.keys.routing.group_of(target.tensor), target.tensor

    def _held(self, space: str, route: Route) -> bool:
        params = self._params.get(space, {})
        return all(p.param in params and params[p.param].device.type != "meta" for p in route.pieces)

    def _param(self, space: str, name: str) -> nn.Parameter:
        return self.spaces[space].get_parameter(name)  # looked up anew: an fp8 layer replaces its weight

    def _owner(self, space: str, name: str) -> nn.Module | None:
        owner, _, leaf = name.rpartition(".")
        return self.spaces[space].get_submodule(owner) if leaf == "weight" and owner else None

    def _fp8_layer(self, space: str, name: str) -> nn.Module | None:
        """The layer owning ``name`` when it stores its weight in another form and keeps its own original
        (models/fp8.py's Fp8Linear, an F32 / F16 GGUFLinear: dequantised / requantise_ / restore)."""
        module = self._owner(space, name)
        return module if all(hasattr(module, m) for m in ("dequantised", "requantise_", "restore")) else None

    def _pristine_of(self, space: str, name: str) -> torch.Tensor:
        layer = self._fp8_layer(space, name)
        if layer is not None:
            return layer.dequantised()  # fp32 with its scale; the layer keeps the loaded fp8 values
        key = (space, name)
        if key not in self._pristine:
            # host memory, not pinned: pinning many GB of a big model's weights can fail or stall the host
            self._pristine[key] = self._param(space, name).detach().to("cpu", copy=True)
        return self._pristine[key]

    def _store(self, space: str, name: str, value: torch.Tensor) -> None:
        """Put the patched fp32 ``value`` into the model, rounded once to the tensor's storage."""
        layer = self._fp8_layer(space, name)
        if layer is not None:
            layer.requantise_(value, round_fn=rounding_for(f"{space}.{name}"))
        else:
            param = self._param(space, name)
            param.data.copy_(value.to(param.dtype))

    def _recompute(self, group: tuple[str, str], uses: list[_Use]) -> None:
        space, original = group
        route = self._route_of(space, original)
        layers = deferred_layers(route, lambda name: self._owner(space, name))
        if layers is not None:  # GGUF weights that stay quantised: patched per call, as ComfyUI-GGUF does
            dtype = getattr(self.spaces[space], COMPUTE_DTYPE_ATTR, None) or torch.float32
            patch_group(route, layers, uses, self._tensors, dtype)
            return
        if all(row_separable(use.patch.patch) for use in uses):
            for piece in route.pieces:
                self._recompute_piece(space, piece, uses)
            return
        # One fp32 tensor in the original row order, built from the pristine pieces, patched, scattered back.
        first = self._param(space, route.pieces[0].param)
        device = first.device
        fused = torch.empty((route.rows, *first.shape[1:]), dtype=torch.float32, device=device)
        for piece in route.pieces:
            _put_rows(fused, piece, self._pristine_of(space, piece.param).to(device, torch.float32))
        for use in uses:
            tensors = self._tensors(use, device)
            if use.selector is None:
                apply_patch(fused, use.patch.patch, tensors, use.patch.scale, use.strength)
                continue
            piece = route.piece(use.selector)
            rows = _get_rows(fused, piece)
            apply_patch(rows, use.patch.patch, tensors, use.patch.scale, use.strength)
            if len(piece.segments) > 1:  # a gathered copy: put the patched rows back
                _put_rows(fused, piece, rows)
        for piece in route.pieces:
            self._store(space, piece.param, _get_rows(fused, piece))

    def _recompute_piece(self, space: str, piece: Piece, uses: list[_Use]) -> None:
        """One tensor of a group whose patches are all row-separable, patched on its own rows: an fp32
        tensor in place (its first LoRA fused with the copy of the pristine values: one pass), others
        through one fp32 copy rounded once at the end."""
        param = self._param(space, piece.param)
        device = param.device
        rows: slice | torch.Tensor = slice(*piece.segments[0]) if len(piece.segments) == 1 else piece.index().to(device)
        mine = [use for use in uses if use.selector in (None, piece.param)]
        pristine = self._pristine_of(space, piece.param)
        if param.dtype == torch.float32:
            acc = param.data
            first = mine[0] if mine else None
            if first is not None and first.patch.patch.kind == "lora":
                up = self._tensors(first, device)["up"]
                up = (
                    up
                    if first.selector is not None
                    else (up[rows] if isinstance(rows, slice) else up.index_select(0, rows))
                )
                down = self._tensors(first, device)["down"]
                source = pristine.to(device).view(acc.shape[0], -1)
                scale = first.patch.scale * first.strength
                torch.addmm(
                    source,
                    up.flatten(start_dim=1),
                    down.flatten(start_dim=1),
                    alpha=scale,
                    out=acc.view(acc.shape[0], -1),
                )
                mine = mine[1:]
            else:
                acc.copy_(pristine)
        else:
            acc = pristine.to(device, torch.float32)
        for use in mine:
            tensors = self._tensors(use, device)
            if use.selector is None:  # a patch of the whole original tensor: this piece's rows of it
                apply_patch_rows(acc, use.patch.patch, tensors, use.patch.scale, use.strength, rows)
            else:
                apply_patch(acc, use.patch.patch, tensors, use.patch.scale, use.strength)
        if acc is not param.data:
            self._store(space, piece.param, acc)

    def _tensors(self, use: _Use, device: torch.device) -> dict[str, torch.Tensor]:
        stored = self._files[use.file].tensors
        return {role: stored[key].to(device, torch.float32) for role, key in use.patch.patch.keys.items()}

    def _restore(self, group: tuple[str, str]) -> None:
        space, original = group
        for piece in self._route_of(space, original).pieces:
            layer = self._fp8_layer(space, piece.param)
            if layer is not None:
                layer.restore()
                continue
            pristine = self._pristine.pop((space, piece.param), None)
            if pristine is not None:
                self._param(space, piece.param).data.copy_(pristine)
        del self._applied[group]

    def _route_of(self, space: str, original: str) -> Route:
        if space == TRANSFORMER:
            return self.keys.routing.routes[original]
        param = self._param(space, original)
        rows = param.shape[0] if param.dim() else 1
        return Route(original, rows, (Piece(original, ((0, rows),)),))


def _get_rows(t: torch.Tensor, piece: Piece) -> torch.Tensor:
    """The rows of ``piece`` in ``t``: a view for one segment, else a gathered copy."""
    if len(piece.segments) == 1:
        start, stop = piece.segments[0]
        return t[start:stop]
    return t.index_select(0, piece.index().to(t.device))


def _put_rows(t: torch.Tensor, piece: Piece, value: torch.Tensor) -> None:
    if len(piece.segments) == 1:
        start, stop = piece.segments[0]
        t[start:stop] = value
    else:
        t.index_copy_(0, piece.index().to(t.device), value)
