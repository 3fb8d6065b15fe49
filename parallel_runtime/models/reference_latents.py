"""Reference images of edit models (FLUX.1 Kontext, Qwen-Image-Edit): latents that ride in the token sequence.

ComfyUI's ``ReferenceLatent`` node appends a VAE latent to a conditioning's ``reference_latents``. An edit
model patchifies each reference exactly as it patchifies the image being denoised (padding it to whole
patches, wrapping around), gives every reference token a position id (index, row, column) and appends the
tokens after the image's own in every attention call; the prediction keeps the image's tokens only. The
references are clean (never noised) and are in model space (the latent format is applied to them as to the
image).

Where the references sit is the ``reference_latents_method`` (FluxKontextMultiReferenceLatentMethod):

- ``offset`` (FLUX.1's default): every reference has index 1; the references are packed into one growing
  box, each one put to the right of what is there when putting it below would make the box taller than it is
  wide (measured with this reference added), else below it. Offsets are latent pixels, made token offsets by
  rounding half up: ``(offset + p // 2) // p``.
- ``index`` (Qwen-Image's default): reference ``k`` (counting from 1) has index ``k`` and no offset.

A family turns (index, token row offset, token column offset, rows, cols) into its own ids (FLUX.1 counts rows
from 0, Qwen-Image centres them). This module holds what they share: the extras carried in
``Conditioning.extras`` (the references' raw patches and ids, batch first, so batching, CFG branches and
sequence parallelism treat them like any other conditioning tensor) and the placement rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import ConfigError
from . import token_grid
from .base import Conditioning, ConditioningExtras
from .latent_formats import LatentFormat

METHODS = ("offset", "index")
KEYS = ("reference_latents", "reference_latents_method")  # ComfyUI's conditioning options
IdsOf = Callable[[int, int, int, int, int], torch.Tensor]  # (index, row off, col off, rows, cols) -> [rows*cols, 3]


@dataclasses.dataclass(frozen=True)
class ReferenceLatents(ConditioningExtras):
    """Every reference image of one conditioning entry, in order, as tokens."""

    tokens: torch.Tensor  # [B, R, C*p*p] raw (VAE-space) latent patches, in the model's patch layout
    ids: torch.Tensor  # [B, R, 3] their position ids (the same for every batch item)


def placements(sizes: Sequence[tuple[int, int]], method: str) -> list[tuple[int, int, int]]:
    """(index, row offset, column offset) in latent pixels of references of ``sizes`` (height, width)."""
    if method == "index":
        return [(k + 1, 0, 0) for k in range(len(sizes))]
    out, box_h, box_w = [], 0, 0
    for height, width in sizes:
        right = height + box_h > width + box_w  # below would make the box taller than wide: go right
        row, col = (0, box_w) if right else (box_h, 0)
        box_h, box_w = max(box_h, row + height), max(box_w, col + width)
        out.append((1, row, col))
    return out


def from_options(
    options: Mapping[str, Any],
    expected: Mapping[str, int | None],
    where: str,
    *,
    label: str,
    patch: int,
    layout: token_grid.PatchLayout,
    default_method: str,
    ids_of: IdsOf,
) -> ReferenceLatents | None:
    """The references of one CONDITIONING entry's ``options`` (None when it has none); ``expected`` is the
    model's ``expected_conditioning()`` (its ``latent_channels`` checked when given)."""
    latents = options.get("reference_latents")
    if latents is None:
        return None
    method = options.get("reference_latents_method") or default_method
    if method not in METHODS:
        raise ConfigError(
            f"the {where} conditioning's reference_latents_method is {method!r}",
            f"the parallel sampler places {label} reference images by {' or '.join(METHODS)}; the UXO/USO placement "
            "(after the output image) is not supported yet",
            "set FluxKontextMultiReferenceLatentMethod to offset or index, or use ComfyUI's KSampler",
        )
    if isinstance(latents, torch.Tensor):
        latents = [latents]
    planes = [_plane(lat, where, k) for k, lat in enumerate(latents)]
    if not planes:
        return None
    channels = {p.shape[1] for p in planes}
    batches = {p.shape[0] for p in planes} - {1}
    if len(channels) != 1 or len(batches) > 1:
        raise ConfigError(
            f"the {where} conditioning's reference latents have shapes {[tuple(p.shape) for p in planes]}",
            "every reference image is a latent of the same VAE, with a batch of 1 or the same batch as the others",
            "encode every reference image with this model's VAE (VAEEncode) before ReferenceLatent",
        )
    want = expected.get("latent_channels")
    if want is not None and channels != {int(want)}:
        raise ConfigError(
            f"the {where} conditioning's reference latent has {planes[0].shape[1]} channels; this {label} model's "
            f"latents have {want}",
            f"a reference image rides in the sequence as the {label} model's own latent tokens",
            f"encode the reference image with this {label} model's VAE before ReferenceLatent",
        )
    batch = max(p.shape[0] for p in planes)
    tokens, ids = [], []
    for (index, row, col), plane in zip(placements([tuple(p.shape[-2:]) for p in planes], method), planes):
        padded = _pad(plane, patch)
        grid = (padded.shape[-2] // patch, padded.shape[-1] // patch)
        tokens.append(token_grid.patchify(padded, patch, grid, layout).expand(batch, -1, -1))
        rows, cols = (plane.shape[-2] + patch // 2) // patch, (plane.shape[-1] + patch // 2) // patch
        ids.append(ids_of(index, (row + patch // 2) // patch, (col + patch // 2) // patch, rows, cols))
    all_ids = torch.cat(ids).float()
    return ReferenceLatents(torch.cat(tokens, dim=1).contiguous(), all_ids.expand(batch, -1, -1).contiguous())


def _plane(latent: Any, where: str, k: int) -> torch.Tensor:
    """One reference as [B, C, H, W] float32 on the CPU (a one-frame video latent loses its frame axis)."""
    if isinstance(latent, torch.Tensor) and latent.ndim == 5 and latent.shape[2] == 1:
        latent = latent[:, :, 0]
    if not isinstance(latent, torch.Tensor) or latent.ndim != 4 or min(latent.shape) == 0:
        raise ConfigError(
            f"the {where} conditioning's reference latent {k + 1} has shape {tuple(getattr(latent, 'shape', ()))}",
            "a reference image is a VAE latent [batch, channels, height, width] (or one frame of a video latent)",
            "connect a VAEEncode of the reference image to ReferenceLatent",
        )
    return latent.float().cpu()


def _pad(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``x`` padded at the bottom and right to whole patches, wrapping around (as the image is padded)."""
    pad_h, pad_w = -x.shape[-2] % patch, -x.shape[-1] % patch
    return torch.nn.functional.pad(x, (0, pad_w, 0, pad_h), mode="circular") if pad_h or pad_w else x


def references_of(cond: Conditioning, label: str) -> ReferenceLatents | None:
    """The reference images ``cond`` carries for a family that takes them (None when it has none)."""
    extras = cond.extras
    if extras is None or isinstance(extras, ReferenceLatents):
        return extras
    raise ConfigError(
        f"conditioning with {type(extras).__name__} given to a {label} model",
        "a family's extra conditioning inputs belong to that family's model",
        f"encode the prompt for this {label} model (ReferenceLatent for reference images)",
    )


def reference_count(cond: Conditioning) -> int:
    """How many reference tokens ``cond`` appends to the image's (0 for every other conditioning). A family's
    extras with reference tokens of their own (Wan Fun-Control's reference frame) say how many in
    ``reference_token_count()`` and give themselves without them in ``without_references()``."""
    extras = cond.extras
    if isinstance(extras, ReferenceLatents):
        return extras.tokens.shape[1]
    return extras.reference_token_count() if hasattr(extras, "reference_token_count") else 0


def without_references(cond: Conditioning) -> Conditioning:
    """``cond`` for a model call that reads its reference tokens' kept K/V (PipeFusion) instead of running them."""
    extras = cond.extras
    if not reference_count(cond):
        return cond
    kept = None if isinstance(extras, ReferenceLatents) else extras.without_references()
    return dataclasses.replace(cond, extras=kept)


def in_model_space(
    tokens: torch.Tensor, latent_format: LatentFormat, patch: int, layout: token_grid.PatchLayout
) -> torch.Tensor:
    """Raw latent patches [B, R, C*p*p] mapped to model space by ``latent_format`` (per channel)."""
    b, r, width = tokens.shape
    c = width // (patch * patch)
    split = (b, r, c, patch * patch) if layout == "cpq" else (b, r, patch * patch, c)
    per_channel = tokens.reshape(split)
    per_channel = per_channel.permute(0, 2, 1, 3) if layout == "cpq" else per_channel.permute(0, 3, 1, 2)
    mapped = latent_format.to_model(per_channel)  # channels on dim 1
    mapped = mapped.permute(0, 2, 1, 3) if layout == "cpq" else mapped.permute(0, 2, 3, 1)
    return mapped.reshape(b, r, width)
