"""Host-side checks of one sampling request, before any worker runs: settings, the latent's size
against the model's limits and the layout, and conditioning the layout cannot honour.

Each failure is a ``ConfigError`` saying what is wrong, why, and how to fix it (never a remote
traceback from a worker)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..denoise.caching.specs import BlockCacheSpec, StepCacheSpec
from ..denoise.entries import Branch, CondEntry
from ..denoise.regions import place
from ..errors import ConfigError
from ..models.reference_latents import reference_count
from ..parallel.config import ParallelConfig
from ..pipefusion.block_cache_stage import STEP_CACHE_UNDER_PIPEFUSION
from ..pipefusion.branches import REFERENCES_WITH_AREAS, check_windows
from ..pipefusion.references import REFERENCES_WITH_BLOCK_CACHE
from ..pipefusion.schedule import require_per_patch
from ..sampling import SAMPLER_NAMES, SCHEDULER_NAMES, sampler_spec, uses_uncond
from .families import check_extras
from .input_checks import schedule


def check_sampling_args(
    sampler: str,
    scheduler: str,
    steps: int,
    denoise: float,
    eta: float | None = None,
    s_noise: float | None = None,
) -> None:
    """Sampler and scheduler names, steps and denoise as KSampler accepts them, and a SAMPLER's noise
    options (eta / s_noise) where the sampler has them."""
    if sampler not in SAMPLER_NAMES:
        raise ConfigError(
            f"unknown sampler {sampler!r}",
            "the Parallel Sampler runs the samplers of ComfyUI 0.3.64's KSampler under their ComfyUI names, and "
            "this name is none of them (a typo, or a sampler another custom node adds)",
            f"use one of {', '.join(SAMPLER_NAMES)}",
        )
    if scheduler not in SCHEDULER_NAMES:
        raise ConfigError(
            f"unknown scheduler {scheduler!r}",
            "the Parallel Sampler builds the schedules of ComfyUI 0.3.64's KSampler under their ComfyUI names, "
            "and this name is none of them (a typo, or a scheduler another custom node adds)",
            f"use one of {', '.join(SCHEDULER_NAMES)}",
        )
    steps, denoise = schedule(steps, denoise)
    spec = sampler_spec(sampler)
    scheduled = 0 if denoise <= 0 else (steps if denoise > 0.9999 else int(steps / denoise)) + spec.drops_penultimate
    if scheduler == "kl_optimal" and scheduled == 1:
        raise ConfigError(
            "the kl_optimal scheduler with 1 step",
            "its formula spaces steps by 1 / (steps - 1): ComfyUI's own kl_optimal gives NaN sigmas for 1 step",
            "use 2 or more steps, or another scheduler for a single step",
        )
    for option, value in (("eta", eta), ("s_noise", s_noise)):
        if value is None:
            continue
        if option not in spec.options:
            raise ConfigError(
                f"{option}={value!r} for the {sampler} sampler",
                f"{sampler} has no {option}, so the value would be silently ignored",
                f"drop it, or choose a sampler that has {option}",
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"{option}={value!r}", f"{option} scales the added noise", f"use a number >= 0 as {option}"
            )


def check_latent_size(info: Mapping[str, Any], config: ParallelConfig, height: int, width: int) -> None:
    """The latent (``height`` x ``width`` latent pixels) against the model and the layout.

    ``info`` is the model's load info: ``patch_size``, ``spatial_factor``, ``pads_to_patch`` (ComfyUI's
    model pads a latent that is not a multiple of the patch and crops back) and ``max_grid_side``
    (the most token rows/columns its position embedding covers, e.g. SD3's ``pos_embed_max_size``)."""
    p, f = int(info.get("patch_size", 2)), int(info.get("spatial_factor", 8))
    family = info.get("family", "this")
    if height < 1 or width < 1:
        raise ConfigError(
            f"the latent is {width}x{height} latent pixels",
            "an image needs at least one latent pixel a side",
            "make the latent with an empty-latent node or VAE Encode",
        )
    step = p * f
    if height % p or width % p:
        size = f"{width * f}x{height * f} px (latent {width}x{height})"
        fix_size = f"{math.ceil(width / p) * step}x{math.ceil(height / p) * step}"
        if not info.get("pads_to_patch", True):
            raise ConfigError(
                f"the latent is {size}, not a multiple of {step} px",
                f"the {family} transformer makes one token of each {p}x{p} latent patch and its position "
                "embedding covers whole patches only (ComfyUI's own KSampler fails on this size too)",
                f"use a size that is a multiple of {step} px, e.g. {fix_size} (Upscale Latent / ImageScale)",
            )
        if config.pp > 1:
            raise ConfigError(
                f"the latent is {size}, not a multiple of {step} px, and the layout uses PipeFusion",
                "PipeFusion splits the latent into bands of whole token rows; the padding KSampler adds to "
                "reach whole tokens would have to travel between stages",
                f"use a size that is a multiple of {step} px (e.g. {fix_size}), or a layout without PipeFusion",
            )
    most = info.get("max_grid_side")
    rows, cols = math.ceil(height / p), math.ceil(width / p)
    if most is not None and max(rows, cols) > int(most):
        largest = int(most) * step
        raise ConfigError(
            f"the latent is {width * f}x{height * f} px: {cols}x{rows} tokens, but this {family} model's position "
            f"embedding covers at most {most}x{most} tokens ({largest}x{largest} px)",
            "the model crops its learned position table to the image; it cannot extend it "
            "(pos_embed_max_size in the model file; ComfyUI's KSampler fails at this size too)",
            f"make the image at most {largest} px a side",
        )


def check_sampler_for_layout(config: ParallelConfig, sampler: str) -> None:
    """PipeFusion runs one sampler per patch: samplers whose steps depend on the whole latent cannot."""
    if config.pp > 1:
        require_per_patch(sampler)


def check_branches_for_layout(
    config: ParallelConfig,
    cfg: float,
    positive: Branch,
    negative: Branch | None,
    sampler: str = "euler",
    block_cache: BlockCacheSpec | None = None,
) -> None:
    """What PipeFusion cannot run (reference images with an area or a block cache; a family's extras that say
    so; ControlNets by kind: ``service.controlnets.check_controls``);
    several entries, timestep ranges, areas, masks and reference images it runs (``pipefusion.branches``; areas
    are checked against the latent by :func:`check_regions`)."""
    if config.pp > 1:
        for entry in (*positive, *(negative or ())):
            refusal = entry.cond.extras.pipefusion_refusal() if entry.cond.extras is not None else None
            if refusal is not None:
                raise ConfigError(*refusal)
        refs = [e for e in (*positive, *(negative or ())) if reference_count(e.cond)]
        if any(_has_window(e) for e in refs):
            raise ConfigError(*REFERENCES_WITH_AREAS)
        if refs and block_cache is not None:
            raise ConfigError(*REFERENCES_WITH_BLOCK_CACHE)


def _has_window(entry: CondEntry) -> bool:
    """Whether the entry runs on a window of the latent (an area, or a mask's bounds), not the whole of it."""
    r = entry.region
    return r is not None and (r.area is not None or r.area_fraction is not None or r.set_area_to_bounds)


def runs_negative(cfg: float, negative: Branch | None, sampler: str) -> bool:
    """Whether sampling evaluates the negative branch: guidance at ``cfg`` needs it, or a CFG++ sampler
    runs it at cfg 1 too (when there is one)."""
    return uses_uncond(cfg, negative) or (sampler_spec(sampler).cfg_pp and negative is not None)


def check_conditioning_fits(
    expected: Mapping[str, int | None], branch: Branch | None, batch: int, role: str, family: str
) -> None:
    """Each entry of ``branch`` against the model and the latent: text embeddings ``embed_dim`` wide,
    a pooled vector ``pooled_dim`` wide when the model takes one, an attention mask of one value per
    token, and a batch of 1 or the latent's for every tensor, a family's extras included (``expected``
    is ``ParallelModel.expected_conditioning()``; a family checks its extras where it makes them)."""
    for index, entry in enumerate(branch or ()):
        where = role if len(branch) == 1 else f"{role} entry {index + 1}"
        _check_entry(expected, entry, batch, where, family)


WIDTHS = (  # (field, what it is, the expected_conditioning() key, what the transformer does with it)
    ("prompt_embeds", "text embeddings are", "embed_dim", "projects its text encoders' embeddings"),
    ("pooled", "pooled output is", "pooled_dim", "adds a pooled text vector to the timestep"),
)


def _check_entry(expected: Mapping[str, int | None], entry: CondEntry, batch: int, where: str, family: str) -> None:
    cond = entry.cond
    encode = "encode the prompt with this model's own text encoders (Parallel Text Encode / encode_text)"
    for field, name_is, key, role in WIDTHS:
        tensor, want, name = getattr(cond, field), expected.get(key), name_is.rsplit(" ", 1)[0]
        if want is None:
            continue
        if tensor is None:
            raise ConfigError(
                f"the {where} conditioning has no {name}, which this {family} model needs",
                f"the {family} transformer {role} ({want} wide)",
                encode,
            )
        if tensor.shape[-1] != int(want):
            raise ConfigError(
                f"the {where} conditioning's {name_is} {tensor.shape[-1]} wide but this {family} model takes {want}",
                f"the {family} transformer {role} ({want} wide); conditioning made for another model does not fit",
                encode,
            )
    mask = cond.attention_mask
    if mask is not None and (mask.dim() != 2 or mask.shape[-1] != cond.prompt_embeds.shape[1]):
        raise ConfigError(
            f"the {where} conditioning's attention mask has shape {tuple(mask.shape)} for "
            f"{cond.prompt_embeds.shape[1]} text tokens",
            "the mask holds one value (1 keep, 0 drop) per text token of each prompt: [batch, tokens]",
            "pass the mask the text encoder made with these embeddings, or none",
        )
    check_extras(family, cond.extras, expected, where)
    sizes = {name: t.shape[0] for name, t in cond.tensors().items() if t is not None}
    if any(size not in (1, batch) for size in sizes.values()):
        raise ConfigError(
            f"the {where} conditioning has batch sizes {sizes} but the latent has batch {batch}",
            "each latent of the batch takes its own conditioning, or all share one",
            f"encode one prompt, or {batch} prompts (one per latent)",
        )


def check_caches(
    info: Mapping[str, Any],
    config: ParallelConfig,
    step_cache: StepCacheSpec | None,
    block_cache: BlockCacheSpec | None,
    sampler: str = "euler",
) -> None:
    """The caches of a Parallel EasyCache / LazyCache / Block Cache node against the model, the layout and the
    sampler."""
    if step_cache is not None and step_cache.kind == "lazycache" and sampler_spec(sampler).cfg_pp:
        raise ConfigError(
            f"Parallel LazyCache cannot run the CFG++ sampler {sampler!r}",
            "LazyCache reuses a whole guided prediction, but a CFG++ step also needs that evaluation's "
            "unconditional prediction, which a reused step does not have",
            "use Parallel EasyCache or the Parallel Block Cache (both cache per model call), or a sampler "
            "without CFG++",
        )
    if step_cache is not None and config.pp > 1:
        raise ConfigError(*STEP_CACHE_UNDER_PIPEFUSION)
    if block_cache is not None:
        blocks = info.get("num_blocks")
        if blocks is not None:
            block_cache.check_blocks(int(blocks))
        per_stage = (info.get("pipefusion") or {}).get("blocks_per_stage")
        if config.pp > 1 and per_stage and block_cache.first_blocks > per_stage[0]:
            raise ConfigError(
                f"Parallel Block Cache computes the first {block_cache.first_blocks} blocks, but the first "
                f"PipeFusion stage holds {per_stage[0]}",
                "under PipeFusion the stage holding the first blocks decides for every patch and tells the others",
                f"use first_blocks <= {per_stage[0]}, or fewer PipeFusion stages",
            )
        if config.pp > 1 and per_stage and block_cache.last_blocks > per_stage[-1]:
            raise ConfigError(
                f"Parallel Block Cache always computes the last {block_cache.last_blocks} blocks, but the last "
                f"PipeFusion stage holds {per_stage[-1]}",
                "the blocks that always run after the cached ones must sit on the last stage",
                f"use last_blocks <= {per_stage[-1]}",
            )


def check_regions(
    shape: tuple[int, ...],
    positive: Branch,
    negative: Branch | None,
    caches: bool,
    config: ParallelConfig,
    patch: int = 2,
) -> None:
    """Area and mask conditioning (``denoise.regions``) placed on the latent here, so a bad area or mask
    fails before any worker runs; the step and block caches do not take them, PipeFusion takes areas of whole
    tokens (``patch``: the model's patch size)."""
    entries = [e for b in (positive, negative or ()) for e in b]
    if not any(e.region is not None for e in entries):
        return
    if caches:
        raise ConfigError(
            "a step or block cache with area or mask conditioning",
            "the caches decide per model call over the whole latent; an area entry's call sees a window of it",
            "remove the cache node, or the ConditioningSetArea / ConditioningSetMask nodes",
        )
    if any(e.region is not None and e.control is not None for e in entries):
        raise ConfigError(
            "a ControlNet on a conditioning entry with an area or mask",
            "an area entry's model call sees a window of the latent, and the ControlNet's hint is made for the "
            "whole latent",
            "apply the ControlNet to an entry without ConditioningSetArea / ConditioningSetMask",
        )
    for entry in entries:
        where = place(entry.region, entry.strength, shape)
        if not where.whole and entry.cond.extras is not None:
            raise ConfigError(
                "an area on a conditioning entry with the model's extra inputs (e.g. FLUX.1 Fill's image and mask)",
                "an area entry's model call sees a window of the latent; those inputs are made for the whole latent",
                "give that entry no area (ConditioningSetMask without 'mask bounds' keeps the whole latent)",
            )
    if config.pp > 1:
        check_windows(entries, shape, patch)
