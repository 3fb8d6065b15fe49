"""ComfyUI's CONDITIONING <-> the runtime's conditioning branches, with shape checks against the model.

ComfyUI's CONDITIONING is a list of entries ``[embeddings [B,T,D], {"pooled_output": [B,Dp],
"guidance": float, ...}]``. Every entry becomes a ``CondEntry`` with what KSampler honours of its
options: Flux guidance (FluxGuidance), strength (ConditioningSetAreaStrength), the timestep range
(ConditioningSetTimestepRange), an area (ConditioningSetArea / ConditioningSetAreaPercentage) and a mask
(ConditioningSetMask, with its strength and "mask bounds"); several entries (ConditioningCombine) are
weighed as KSampler weighs them. A ControlNet chain (ControlNetApplyAdvanced with Parallel ControlNet Loader)
is read with its hints encoded at the latent's size (``comfy_control.read_control``). Options the parallel
sampler cannot honour (GLIGEN, hooks, ...) are refused instead of ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from . import families

if TYPE_CHECKING:
    from ..denoise.entries import CondEntry
    from ..models.base import Conditioning

UNSUPPORTED_KEYS = {
    "gligen": "GLIGEN boxes",
    "hooks": "conditioning hooks",
    "reference_latents": "reference latents (Kontext / edit models)",
    "concat_latent_image": "an inpainting image",
    "concat_mask": "an inpainting mask",
    "clip_vision_output": "a CLIP-vision image embedding",
    "unclip_conditioning": "unCLIP image conditioning",
    "clip_start_percent": "a scheduled CLIP hook",
}


EXTRAS_OPTION = "dit_parallel_extras"  # a family's extra inputs from Parallel Text Encode (Conditioning.extras)


def guess_source(embed_dim: int, pooled_dim: int | None) -> str:
    """A readable name for where conditioning of this shape usually comes from."""
    if embed_dim == 768:
        return "SD1.x"
    if embed_dim == 1024:
        return "SD2.x"
    if embed_dim == 2048:
        return "SDXL"
    if embed_dim == 4096:
        return {2048: "SD3", 768: "Flux", None: "T5 (PixArt)"}.get(pooled_dim, "T5")
    if embed_dim == 3584:
        return "Qwen2.5-VL (Qwen-Image)"
    if embed_dim == 15360:
        return "Mistral (FLUX.2)"
    return f"{embed_dim}-wide"


def _model_label(family: str) -> str:
    return families.label(family)


def _comfy_encoders(family: str, fallback: str) -> str:
    return families.comfy_text_encoders(family) or fallback


def to_branch(
    conditioning: Any,
    expected: Mapping[str, int | None],
    family: str,
    role: str = "positive",
    latent_shape: tuple[int, ...] | None = None,
) -> tuple[CondEntry, ...]:
    """One ComfyUI CONDITIONING -> its entries (``CondEntry``), each checked against the model.

    ``expected`` is ``ParallelModel.expected_conditioning()``: ``{"embed_dim", "pooled_dim"}``; ``latent_shape``
    the sampled latent's (a ControlNet's hint is encoded at its size)."""
    if not isinstance(conditioning, (list, tuple)) or not conditioning:
        raise ConfigError(
            f"the {role} input is not a CONDITIONING (got {type(conditioning).__name__})",
            "the sampler needs ComfyUI conditioning: a list of [embeddings, options] pairs",
            f"connect a text encoder (Parallel Text Encode) to {role}",
        )
    return tuple(
        _entry(entry, expected, family, role, i, len(conditioning), latent_shape)
        for i, entry in enumerate(conditioning)
    )


def _entry(
    entry: Any,
    expected: Mapping[str, int | None],
    family: str,
    role: str,
    index: int,
    count: int,
    latent_shape: tuple[int, ...] | None = None,
):
    import torch

    from ..denoise.entries import CondEntry
    from ..models.base import Conditioning

    label = _model_label(family)
    where = role if count == 1 else f"{role} entry {index + 1} of {count}"
    if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], torch.Tensor)):
        raise ConfigError(
            f"the {where} conditioning is malformed ({type(entry).__name__})",
            "each entry must be [embeddings tensor, options dict]",
            "connect the output of a text encoder node",
        )
    embeds, options = entry[0], dict(entry[1] or {})
    extras = options.get(EXTRAS_OPTION)  # what Parallel Text Encode made (a family's extra states)
    if extras is None:
        extras = families.conditioning_extras(family, options, expected, where)
    taken = families.conditioning_keys(family)  # e.g. WanImageToVideo's start image, for Wan
    for key, what in UNSUPPORTED_KEYS.items():
        if key in taken:
            continue
        if options.get(key) is not None:
            raise ConfigError(
                f"the {where} conditioning carries {what} ({key!r})",
                "the parallel sampler applies text conditioning (with guidance, strength and timestep ranges) "
                "only; it would silently ignore this",
                "remove that node from the graph, or use ComfyUI's own KSampler for this feature",
            )
    if embeds.ndim == 2:
        embeds = embeds.unsqueeze(0)
    if embeds.ndim != 3:
        raise ConfigError(
            f"the {where} text embeddings have shape {tuple(embeds.shape)}",
            "text embeddings are [batch, tokens, width]",
            "connect a text encoder's CONDITIONING",
        )
    pooled = options.get("pooled_output")
    pooled_dim = int(pooled.shape[-1]) if isinstance(pooled, torch.Tensor) else None
    want_dim, want_pooled = expected.get("embed_dim"), expected.get("pooled_dim")
    width = int(embeds.shape[-1])
    if want_dim is not None and width != int(want_dim):
        source = guess_source(width, pooled_dim)
        raise ConfigError(
            f"{source} conditioning given to a {label} model: the {where} text embeddings are {width} wide, "
            f"this model expects {want_dim}",
            f"the {label} transformer projects text embeddings of its own text encoders ({want_dim} wide)",
            f"encode the prompt with Parallel Text Encode on this PARALLEL_MODEL, or with ComfyUI's "
            f"{_comfy_encoders(family, 'text encoder for this model')}",
        )
    if want_pooled is not None:
        if pooled_dim is None:
            raise ConfigError(
                f"the {where} conditioning has no pooled_output, which a {label} model needs",
                f"{label} adds a pooled text vector ({want_pooled} wide) to the timestep embedding",
                f"use Parallel Text Encode, or ComfyUI's {_comfy_encoders(family, 'text encoder')}",
            )
        if pooled_dim != int(want_pooled):
            raise ConfigError(
                f"{guess_source(width, pooled_dim)} conditioning given to a {label} model: the {where} pooled "
                f"output is {pooled_dim} wide, this model expects {want_pooled}",
                f"the {label} transformer's pooled projection takes {want_pooled} features",
                f"encode the prompt with Parallel Text Encode or ComfyUI's {_comfy_encoders(family, 'text encoder')}",
            )
        pooled = pooled.reshape(pooled.shape[0] if pooled.ndim > 1 else 1, -1).float().cpu()
    else:
        pooled = None
    mask = options.get("attention_mask")
    mask = mask.reshape(embeds.shape[0], -1).cpu() if isinstance(mask, torch.Tensor) else None
    if mask is not None and mask.shape[1] != embeds.shape[1]:
        mask = None  # a mask for other tokens (e.g. a padded encoder) cannot be applied: run unmasked
    guidance = options.get("guidance")
    control = options.get("control")
    if control is not None:
        from .comfy_control import read_control

        control = read_control(control, latent_shape, where)
    return CondEntry(
        Conditioning(embeds.float().cpu(), pooled, mask, extras),
        region=_region(options, where),
        guidance=None if guidance is None else float(guidance),
        strength=float(options.get("strength", 1.0)),
        start_percent=None if options.get("start_percent") is None else float(options["start_percent"]),
        end_percent=None if options.get("end_percent") is None else float(options["end_percent"]),
        control=control,
    )


def _region(options: Mapping[str, Any], where: str):
    """The entry's area / mask options (None without either)."""
    import torch

    from ..denoise.regions import Region

    area, mask = options.get("area"), options.get("mask")
    if area is None and mask is None:
        return None
    pixel_area = fraction = None
    if area is not None:
        parts = list(area)
        percentage = bool(parts) and parts[0] == "percentage"
        numbers = parts[1:] if percentage else parts
        if len(numbers) != 4 or not all(isinstance(n, (int, float)) for n in numbers):
            raise ConfigError(
                f"the {where} conditioning has an area {tuple(parts)!r}",
                "the parallel sampler takes image areas: (height, width, y, x) in latent pixels, or "
                "('percentage', height, width, y, x)",
                "set the area with ConditioningSetArea or ConditioningSetAreaPercentage",
            )
        if percentage:
            fraction = tuple(float(n) for n in numbers)
        else:
            pixel_area = tuple(int(n) for n in numbers)
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise ConfigError(
            f"the {where} conditioning has a mask of type {type(mask).__name__}",
            "ConditioningSetMask stores a MASK tensor",
            "connect a MASK to ConditioningSetMask",
        )
    return Region(
        area=pixel_area,
        area_fraction=fraction,
        mask=None if mask is None else mask.float().cpu(),
        mask_strength=float(options.get("mask_strength", 1.0)),
        set_area_to_bounds=bool(options.get("set_area_to_bounds", False)),
    )


def from_runtime(cond: Conditioning, **extras: Any) -> list[list[Any]]:
    """Runtime Conditioning -> ComfyUI CONDITIONING (one entry)."""
    options: dict[str, Any] = {}
    if cond.pooled is not None:
        options["pooled_output"] = cond.pooled
    if cond.attention_mask is not None:
        options["attention_mask"] = cond.attention_mask
    if cond.extras is not None:
        options[EXTRAS_OPTION] = cond.extras
    options.update({k: v for k, v in extras.items() if v is not None})
    return [[cond.prompt_embeds, options]]
