"""fp8 weight storage with compute in a wider dtype: the layers of ``*_fp8_e4m3fn*.safetensors`` files.

Three file conventions are read (the header decides; nothing is guessed from the file name):

- plain fp8: Linear weights stored as F8_E4M3 / F8_E5M2, no scales (weight = stored value);
- ComfyUI "fp8 scaled": a ``scaled_fp8`` marker tensor and, per Linear, ``<layer>.scale_weight`` (a float32
  scalar; weight = stored value x scale) and maybe ``<layer>.scale_input`` (only for fp8 matrix products).
  ComfyUI creates every Linear of such a model in fp8 (the marker's dtype), so whatever a Linear stores
  wider — a bias, or a weight kept in bf16 (some files keep the layers outside the blocks so, with scale 1
  or none) — is rounded to fp8 as it is loaded; the loader does the same (``QuantInfo.layer_dtype``,
  ``QuantInfo.rounded``, ``weights.TensorSource.round_linear_to``), so results match ComfyUI's;
- comfy-kitchen per-layer quantisation (newer ComfyUI files): ``<layer>.comfy_quant`` (the JSON
  ``{"format": "float8_e4m3fn", ...}`` as bytes), ``<layer>.weight_scale`` and maybe ``<layer>.input_scale``.

An :class:`Fp8Linear` keeps the stored fp8 weight and its scale; each call upcasts the weight to the
input's dtype (scale applied in float32, rounded once), so the wider copy exists only during that call.
``input_scale`` / ``scale_input`` are not needed for that and are ignored. On GPUs with fp8 matrix units a
layer may instead multiply in fp8 (``matmul = "scaled_mm"``, set by :mod:`.fp8_matmul`): the input is
quantised per call (per row, or per tensor) and ``torch._scaled_mm`` multiplies it with the stored weight.

For LoRA (issue 12) a layer offers its dequantised weight and two exact-to-undo ways to change it:
a patched compute-dtype weight used instead of the fp8 one (:meth:`Fp8Linear.set_patched`), or new fp8
values under the same scale, as ComfyUI's scaled-fp8 ``set_weight`` does (:meth:`Fp8Linear.requantise_`);
the fp8 original is kept either way, so :meth:`Fp8Linear.restore` returns it bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError

FP8_DTYPES: Mapping[str, torch.dtype] = MappingProxyType({"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2})
FP8_MAX = MappingProxyType({torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0})
SCALED_MARKER = "scaled_fp8"
COMFY_QUANT = ".comfy_quant"
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
IGNORED_SUFFIXES = (".scale_input", ".input_scale", COMFY_QUANT)
FP8_FORMATS = ("float8_e4m3fn", "float8_e5m2")
WIDE_FLOATS = ("BF16", "F16", "F32")


@dataclasses.dataclass(frozen=True)
class QuantInfo:
    """How a file stores its weights: ``kind`` is "none", "fp8", "fp8_scaled" or "comfy_quant"."""

    kind: str
    fp8_weights: Mapping[str, torch.dtype]  # file key of every fp8 tensor -> its fp8 dtype
    scales: Mapping[str, str]  # file key of a scaled weight -> file key of its scale
    extra_keys: frozenset[str]  # markers, input scales, comfy_quant blobs: not model tensors
    layer_dtype: torch.dtype | None = None  # "fp8 scaled" (0.3.x): ComfyUI makes every Linear, bias too, this dtype
    rounded: frozenset[str] = frozenset()  # scaled weights stored wider: read rounded to layer_dtype (in fp8_weights)

    def stored(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """The file's tensor ``key`` as ComfyUI's model holds it: a scaled weight stored wider rounded to fp8."""
        return tensor.to(self.layer_dtype) if key in self.rounded else tensor

    @property
    def quantised(self) -> bool:
        return self.kind != "none"


def detect_quantisation(
    header: Mapping[str, Mapping[str, Any]], read_small: Callable[[str], torch.Tensor] | None = None
) -> QuantInfo:
    """Read the file's fp8 convention from its safetensors ``header`` (name -> {"dtype", "shape"}).
    ``read_small(name)`` reads a small tensor (the ``comfy_quant`` blobs); without it they are not checked."""
    names = [k for k in header if k != "__metadata__"]
    fp8 = {k: FP8_DTYPES[header[k]["dtype"]] for k in names if header[k].get("dtype") in FP8_DTYPES}
    marker = [k for k in names if k == SCALED_MARKER or k.endswith("." + SCALED_MARKER)]
    extra = set(marker) | {k for k in names if k.endswith(IGNORED_SUFFIXES)}
    scales: dict[str, str] = {}
    for key in names:
        for suffix in SCALE_SUFFIXES:
            if key.endswith(suffix):
                weight = key[: -len(suffix)] + ".weight"
                _check_scale_shape(key, header[key])
                scales[weight] = key
                extra.add(key)
    layer_dtype = None
    if marker or scales:
        marked = FP8_DTYPES.get(header[marker[0]].get("dtype")) if marker else None
        layer_dtype = marked or torch.float8_e4m3fn  # ComfyUI reads a float32 marker as e4m3fn
    rounded = set()
    for weight, key in scales.items():
        if weight in fp8:
            continue
        stored = header.get(weight, {}).get("dtype")
        if not (marker and stored in WIDE_FLOATS):  # without the marker ComfyUI would ignore the scale
            raise ConfigError(
                f"{key} scales {weight}, which is "
                + (
                    f"stored in {stored.lower()} in a file without the {SCALED_MARKER} marker"
                    if stored
                    else "not in the file"
                ),
                "a weight scale belongs to a weight stored in fp8, or (in ComfyUI's fp8-scaled files, marked by "
                f"a {SCALED_MARKER} tensor) to a wider weight rounded to fp8 as it loads",
                "use an unmodified fp8 release of the model (or its bf16 file)",
            )
        rounded.add(weight)
        fp8[weight] = layer_dtype
    quant_layers = [k[: -len(COMFY_QUANT)] for k in names if k.endswith(COMFY_QUANT)]
    if quant_layers and read_small is not None:
        for layer in quant_layers:
            _check_comfy_quant(layer, read_small(layer + COMFY_QUANT))
    fp8 = {k: v for k, v in fp8.items() if k not in extra}
    if quant_layers:
        kind, layer_dtype = "comfy_quant", None
    elif marker or scales:
        kind = "fp8_scaled"
    else:
        kind = "fp8" if fp8 else "none"
    return QuantInfo(
        kind, MappingProxyType(fp8), MappingProxyType(scales), frozenset(extra), layer_dtype, frozenset(rounded)
    )


def _check_scale_shape(key: str, entry: Mapping[str, Any]) -> None:
    shape = tuple(entry.get("shape", ()))
    if len(shape) > 1 or (shape and shape[0] != 1):
        raise ConfigError(
            f"{key} is a scale of shape {shape}",
            "fp8 weights are read with one scale per tensor; per-channel or per-block scales are another format",
            "use the model's bf16 file or an fp8 file with per-tensor scales (ComfyUI's fp8 / fp8 scaled releases)",
        )


def _check_comfy_quant(layer: str, blob: torch.Tensor) -> None:
    try:
        conf = json.loads(bytes(blob.to(torch.uint8).flatten().tolist()).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        conf = {}
    fmt = conf.get("format") if isinstance(conf, dict) else None
    if fmt not in FP8_FORMATS:
        raise ConfigError(
            f"layer {layer} is stored as {fmt or 'an unreadable quantisation'} (comfy_quant)",
            f"only per-tensor fp8 layers ({', '.join(FP8_FORMATS)}) are upcast on the fly here",
            "use the model's fp8 (e4m3fn) or bf16 file",
        )


class Fp8Linear(nn.Linear):
    """An nn.Linear whose ``weight`` is stored in fp8 with a float32 ``weight_scale``; computes in the input's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None):
        super().__init__(in_features, out_features, bias=bias, device="meta")
        self.register_buffer("weight_scale", torch.ones((), dtype=torch.float32, device=device or "meta"))
        self.scaled = False  # weight_scale != 1 (known at load, so forward never reads the tensor's value)
        self.patched: torch.Tensor | None = None
        self.original: torch.Tensor | None = None  # fp8 weight before requantise_, for restore()
        self.matmul = "upcast"  # or "scaled_mm" (models.fp8_matmul chooses)
        self.rowwise = True  # scaled_mm: one input scale per row (else one per tensor)

    @classmethod
    def like(cls, linear: nn.Linear) -> Fp8Linear:
        """An empty (meta) Fp8Linear with ``linear``'s sizes."""
        return cls(linear.in_features, linear.out_features, bias=linear.bias is not None)

    def compute_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype``: the patched one if set, else fp8 x scale (float32 product, one rounding)."""
        if self.patched is not None:
            return self.patched.to(dtype)
        if self.scaled:
            return (self.weight.to(torch.float32) * self.weight_scale).to(dtype)
        return self.weight.to(dtype)  # fp8 values are exact in bf16/fp16/fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.matmul == "scaled_mm" and self.patched is None and x.dtype in (torch.bfloat16, torch.float16):
            return scaled_mm_linear(self, x)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.compute_weight(x.dtype), bias)

    # -- for LoRA and conversion ------------------------------------------------------------------
    def dequantised(self) -> torch.Tensor:
        """The stored weight as float32 with its scale applied (ignores a patch)."""
        w = self.original if self.original is not None else self.weight
        return w.to(torch.float32) * self.weight_scale

    def set_patched(self, weight: torch.Tensor) -> None:
        """Use ``weight`` (any float dtype, e.g. W + LoRA delta) instead of the fp8 weight until :meth:`restore`."""
        self.patched = weight.detach()

    def requantise_(
        self, weight: torch.Tensor, round_fn: Callable[[torch.Tensor, torch.dtype], torch.Tensor] | None = None
    ) -> None:
        """Store ``weight`` (float32) as new fp8 values under the SAME scale, as ComfyUI's scaled-fp8 ``set_weight``
        does; ``round_fn(x, fp8_dtype)`` replaces round-to-nearest (ComfyUI rounds stochastically)."""
        if self.original is None:
            self.original = self.weight.data
        dtype = self.original.dtype
        x = (weight.to(torch.float32) / self.weight_scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
        self.weight = nn.Parameter(round_fn(x, dtype) if round_fn else x.to(dtype), requires_grad=False)

    def restore(self) -> None:
        """Back to the loaded fp8 weight, bit for bit."""
        self.patched = None
        if self.original is not None:
            self.weight = nn.Parameter(self.original, requires_grad=False)
            self.original = None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, storage={self.weight.dtype}, scaled={self.scaled}"


def scaled_mm_linear(layer: Fp8Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` multiplied in fp8: ``x`` quantised to e4m3 with a dynamic scale (max |x| / 448 per row, or
    per tensor), the stored weight with its own scale, the product accumulated by ``torch._scaled_mm`` in the
    input's dtype. Rows are padded to a multiple of 16 (what the fp8 kernels take)."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    count = rows.shape[0]
    pad = -count % 16
    if pad:
        rows = F.pad(rows, (0, 0, 0, pad))
    top = FP8_MAX[torch.float8_e4m3fn]
    amax = rows.abs().amax(dim=1, keepdim=True) if layer.rowwise else rows.abs().amax().reshape(1, 1)
    scale_a = (amax.float() / top).clamp(min=1e-12)
    quantised = (rows.float() / scale_a).clamp(-top, top).to(torch.float8_e4m3fn)
    scale_b = layer.weight_scale.to(torch.float32).reshape(1, 1)
    if layer.rowwise:
        scale_b = scale_b.expand(1, layer.out_features).contiguous()
    else:
        scale_a, scale_b = scale_a.reshape(()), scale_b.reshape(())
    out = torch._scaled_mm(quantised, layer.weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=x.dtype)
    out = out[:count] if pad else out
    if layer.bias is not None:
        out = out + layer.bias.to(x.dtype)
    return out.reshape(*shape[:-1], layer.out_features)


def swap_to_fp8(model: nn.Module, weight_names: Iterable[str]) -> list[str]:
    """Replace the nn.Linear owning each ``<module>.weight`` in ``weight_names`` by an empty :class:`Fp8Linear`
    (call on a model whose parameters are on "meta", before loading). Returns the module names swapped;
    names that are not Linear weights are left alone (their tensors are upcast when loaded)."""
    swapped = []
    for name in weight_names:
        owner, _, leaf = name.rpartition(".")
        if leaf != "weight" or not owner:
            continue
        module = model.get_submodule(owner)
        if type(module) is not nn.Linear:
            continue
        parent_name, _, child = owner.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Fp8Linear.like(module))
        swapped.append(owner)
    return swapped


def fp8_layers(model: nn.Module) -> dict[str, Fp8Linear]:
    """Every Fp8Linear of ``model`` by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Fp8Linear)}


def set_scale(layer: Fp8Linear, scale: torch.Tensor, device: torch.device) -> None:
    """Give ``layer`` its per-tensor scale (a float32 scalar read from the file)."""
    value = scale.to(torch.float32).reshape(())
    layer.weight_scale = value.to(device)
    layer.scaled = bool(value != 1.0)


def quantise_per_tensor(
    weight: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 values, float32 scale) with scale = max|W| / fp8 max (for storing a bf16 file's weights in fp8)."""
    w = weight.to(torch.float32)
    scale = (w.abs().max() / FP8_MAX[dtype]).clamp(min=torch.finfo(torch.float32).tiny)
    return (w / scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype), scale


def dequantise_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace every Fp8Linear by an nn.Linear holding its compute weight in ``dtype`` (the bf16 reference of
    an fp8 model, and the "convert to bf16" option on an already loaded model)."""
    for name, layer in fp8_layers(model).items():
        linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
        device = layer.weight.device
        linear.weight = nn.Parameter(layer.compute_weight(dtype).to(device), requires_grad=False)
        if layer.bias is not None:
            linear.bias = nn.Parameter(layer.bias.detach().to(dtype), requires_grad=False)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, linear)
    return model
