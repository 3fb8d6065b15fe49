"""Which model tensor a LoRA module name means: the name families ComfyUI accepts, for our models.

A model is described by a :class:`ModelKeys` table (names and shapes only): the transformer's diffusers
tensors, its original-layout tensors with their row routing (when the family has an original layout), and
each text encoder with the role ComfyUI gives it (clip_l, clip_g, t5xxl; each family states them:
``FamilySpec.text.lora_roles``). From it, every name a LoRA
trainer may use for a tensor is listed:

- original layout: ``diffusion_model.<name>`` and kohya's ``lora_unet_<name with _ for .>``, and the names a
  family adds (``FamilySpec.lora_aliases``, e.g. ComfyUI's own names of its modules);
- diffusers layout: ``transformer.<name>``, ``base_model.model.<name>``, ``unet.base_model.model.<name>``,
  OneTrainer's ``lora_transformer_<...>`` and SimpleTuner's ``lycoris_<...>``, and the prefixes a family's
  trainers put before diffusers names (``FamilySpec.lora_prefixes``);
- text encoders: ``text_encoders.<role>.transformer.<name>``; CLIP layers as ``lora_te_`` / ``lora_te1_``
  (clip_l), ``lora_te2_`` (clip_g next to clip_l) and diffusers' ``text_encoder(_2).``; T5 as
  ``lora_te<n>_`` after the CLIPs (and ``lora_te2_`` too when only clip_l precedes it, as OneTrainer
  writes Flux files).

CLIP names are spelled with ``text_model.`` as LoRA files (and ComfyUI) do, whatever the installed
transformers version calls the loaded module.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from .routing import Routing

Shape = tuple[int, ...]
TRANSFORMER = "transformer"

_CLIP_LAYER = re.compile(r"text_model\.encoder\.layers\.(\d+)\.(mlp\.fc[12]|self_attn\.(?:[qkv]|out)_proj)\.weight")


@dataclasses.dataclass(frozen=True)
class EncoderKeys:
    """A text encoder: its ComfyUI role and tensors (canonical name -> (loaded name, shape))."""

    role: str
    tensors: Mapping[str, tuple[str, Shape]]


@dataclasses.dataclass(frozen=True)
class ModelKeys:
    """Names and shapes of what a LoRA can patch in one loaded model (no weights)."""

    family: str
    params: Mapping[str, Shape]  # transformer tensors under diffusers names
    original: Mapping[str, Shape]  # original-layout tensors ({} when the family has none)
    routing: Routing  # original tensor -> diffusers rows (identity when there is no original layout)
    encoders: Mapping[str, EncoderKeys] = dataclasses.field(default_factory=dict)  # component -> keys


@dataclasses.dataclass(frozen=True)
class Target:
    """The tensor one module patches: in ``space`` (TRANSFORMER or a text-encoder component)."""

    space: str
    tensor: str  # an original-layout name when ``original``, else a name in the loaded module
    original: bool
    shape: Shape


def canonical_encoder_name(name: str, kind: str) -> str:
    """CLIP tensors as LoRA files name them (``text_model.`` prefix); others unchanged."""
    if kind == "clip" and not name.startswith("text_model.") and not name.startswith("text_projection"):
        return "text_model." + name
    return name


def alias_map(keys: ModelKeys) -> dict[str, tuple[Target, Target | None]]:
    """Module name -> (weight target, bias target or None), for every name family ComfyUI accepts."""
    from ..families.registry import find_family

    spec = find_family(keys.family)
    more = spec.lora_aliases if spec is not None else None
    out: dict[str, tuple[Target, Target | None]] = {}
    for name, shape in keys.original.items():
        if name not in keys.routing.routes:  # e.g. a tensor the diffusers model does not use
            continue
        found = _aliases(name, shape, keys.original, True, ("diffusion_model.",), ("lora_unet_",), TRANSFORMER)
        out.update(found)
        if more is not None and name.endswith(".weight"):
            module = name[: -len(".weight")]
            out.update({alias: found["diffusion_model." + module] for alias in more(module)})
    prefixes = ("transformer.", "base_model.model.", "unet.base_model.model.", *(spec.lora_prefixes if spec else ()))
    for name, shape in keys.params.items():
        out.update(_aliases(name, shape, keys.params, False, prefixes, ("lora_transformer_", "lycoris_"), TRANSFORMER))
    for component, encoder in keys.encoders.items():
        out.update(_encoder_aliases(component, encoder, keys.encoders))
    return out


def _aliases(name, shape, table, original, dotted, underscored, space):
    if not name.endswith(".weight"):
        target = Target(space, name, original, tuple(shape))
        return {p + name: (target, None) for p in dotted}
    base = name[: -len(".weight")]
    weight = Target(space, name, original, tuple(shape))
    bias_name = base + ".bias"
    bias = Target(space, bias_name, original, tuple(table[bias_name])) if bias_name in table else None
    found = {p + base: (weight, bias) for p in dotted}
    found.update({p + base.replace(".", "_"): (weight, bias) for p in underscored})
    return found


def _encoder_aliases(component: str, encoder: EncoderKeys, encoders: Mapping[str, EncoderKeys]):
    roles = {e.role for e in encoders.values()}
    out = {}
    for canonical, (loaded, shape) in encoder.tensors.items():
        if not canonical.endswith(".weight"):
            continue
        base = canonical[: -len(".weight")]
        bias = encoder.tensors.get(base + ".bias")
        targets = (
            Target(component, loaded, False, tuple(shape)),
            Target(component, bias[0], False, tuple(bias[1])) if bias else None,
        )
        names = [f"text_encoders.{encoder.role}.transformer.{base}"]
        under = base.replace(".", "_")
        if encoder.role in ("clip_l", "clip_h", "clip_g") and _CLIP_LAYER.fullmatch(canonical):
            if encoder.role == "clip_g" and "clip_l" in roles:
                names += [f"lora_te2_{under}", f"text_encoder_2.{base}"]
            else:
                names += [f"lora_te_{under}", f"text_encoder.{base}"]
                names += [f"lora_te1_{under}"] if encoder.role != "clip_g" else [f"lora_prior_te_{under}"]
        elif encoder.role == "t5xxl":
            index = 1 + ("clip_g" in roles) + ("clip_l" in roles)
            if "clip_l" in roles and index == 2:
                names.append(f"lora_te2_{under}")
                index = 3
            names.append(f"lora_te{index}_{under}")
        elif canonical == "text_projection.weight":
            names += ["lora_te1_text_projection"] if encoder.role == "clip_l" else []
            names += ["lora_prior_te_text_projection", "lora_te2_text_projection"] if encoder.role == "clip_g" else []
        out.update(dict.fromkeys(names, targets))
    return out
