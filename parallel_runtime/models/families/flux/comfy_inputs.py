"""What FLUX.1 takes from a ComfyUI CONDITIONING beyond text: Kontext's reference images (``ReferenceLatent``)
and FLUX.1 Fill's inpainting image and mask (``InpaintModelConditioning``: ``concat_latent_image``,
``concat_mask``; see ``fill``).

FLUX.1 Kontext [dev] is a FLUX.1 dev transformer (same tensors) trained to read reference images that ride
in the token sequence; ComfyUI gives every FLUX.1 model the references a conditioning carries. Their ids are
(index, row + row offset, column + column offset), rows and columns counted from 0 as the image's own; the
default placement is ``offset`` (see ``models.reference_latents``). Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

PACK = 2  # 2x2 latent pixels per token, channel order (c, p, q)
KEYS = ("reference_latents", "reference_latents_method", "concat_latent_image", "concat_mask")
FILL_KEYS = ("concat_latent_image", "concat_mask")


def kontext_ids(index: int, row: int, col: int, rows: int, cols: int):
    """FLUX.1 position ids [rows*cols, 3] of a reference: (index, row + r, col + c), row-major."""
    import torch

    ids = torch.zeros(rows, cols, 3)
    ids[..., 0] = index
    ids[..., 1] = torch.arange(row, row + rows, dtype=torch.float32)[:, None]
    ids[..., 2] = torch.arange(col, col + cols, dtype=torch.float32)[None, :]
    return ids.reshape(rows * cols, 3)


def reference_images(options: Mapping[str, Any], expected: Mapping[str, int | None], where: str):
    """The ``ReferenceLatents`` of one entry's ``options`` (None when it has none)."""
    from ...reference_latents import from_options

    return from_options(
        options, expected, where, label="FLUX.1", patch=PACK, layout="cpq", default_method="offset", ids_of=kontext_ids
    )


def flux_extras(options: Mapping[str, Any], expected: Mapping[str, int | None], where: str):
    """One entry's extras: Fill's image and mask, or Kontext's references (None when it has neither).
    ``expected["in_channels"]`` (the transformer's input features, when known) tells a Fill model apart: it
    must get InpaintModelConditioning's image and mask, and no other FLUX.1 model may (it would ignore them)."""
    from .fill import is_fill

    given = [key for key in FILL_KEYS if options.get(key) is not None]
    in_channels, latent = expected.get("in_channels"), expected.get("latent_channels")
    fill_model = is_fill(in_channels, latent, PACK) if in_channels and latent else None
    if fill_model is False and given:
        raise ConfigError(
            f"the {where} conditioning carries an inpainting image and mask ({', '.join(given)}) for a FLUX.1 "
            "model without extra input channels",
            "only FLUX.1 Fill (384 input features) reads InpaintModelConditioning's image and mask; this model "
            "would ignore them",
            "load flux1-fill-dev, or inpaint with the noise mask only (SetLatentNoiseMask / VAEEncodeForInpaint)",
        )
    if fill_model and len(given) < len(FILL_KEYS):
        raise ConfigError(
            f"the {where} conditioning has no inpainting image and mask for a FLUX.1 Fill model",
            "Fill reads the image to complete and the mask of what to repaint as extra input channels "
            f"(InpaintModelConditioning's {' and '.join(FILL_KEYS)})",
            "put InpaintModelConditioning between both prompts and the sampler",
        )
    if not given:
        return reference_images(options, expected, where)
    if options.get("reference_latents") is not None:
        raise ConfigError(
            f"the {where} conditioning carries both reference latents and an inpainting image",
            "reference images (Kontext) and Fill's image channels are not supported together",
            "use ReferenceLatent with Kontext, or InpaintModelConditioning with Fill",
        )
    return _fill_inputs(options, given, where)


def _fill_inputs(options: Mapping[str, Any], given: list[str], where: str):
    import torch

    from .fill import FluxFillInputs

    if len(given) < len(FILL_KEYS):
        raise ConfigError(
            f"the {where} conditioning has {given[0]} without {next(k for k in FILL_KEYS if k not in given)}",
            "FLUX.1 Fill reads the inpainting image and its mask together",
            "make both with InpaintModelConditioning",
        )
    image, mask = options["concat_latent_image"], options["concat_mask"]
    if not isinstance(image, torch.Tensor) or image.ndim != 4:
        raise ConfigError(
            f"the {where} conditioning's concat_latent_image has shape {tuple(getattr(image, 'shape', ()))}",
            "FLUX.1 Fill takes the image's VAE latent [batch, 16, height/8, width/8]",
            "encode the image with the FLUX.1 VAE (InpaintModelConditioning does)",
        )
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 3, 4):
        raise ConfigError(
            f"the {where} conditioning's concat_mask has shape {tuple(getattr(mask, 'shape', ()))}",
            "the inpainting mask is [height, width], [batch, height, width] or [batch, channels, height, width]",
            "give InpaintModelConditioning a MASK",
        )
    mask = mask.reshape(-1, *mask.shape[-3:]) if mask.ndim == 4 else mask.reshape(-1, 1, *mask.shape[-2:])
    return FluxFillInputs(image.float().cpu(), mask.float().cpu())


def fill_extras_fit(extras: Any, expected: Mapping[str, int | None], where: str) -> None:
    """A Fill model's entries carry Fill's inputs and no other FLUX.1 model's do (``expected["in_channels"]``
    tells a Fill model apart; nothing is checked when it is unknown)."""
    from .fill import FluxFillInputs, is_fill

    in_channels, latent = expected.get("in_channels"), expected.get("latent_channels")
    if not (in_channels and latent):
        return
    fill_model, has_inputs = is_fill(in_channels, latent, PACK), isinstance(extras, FluxFillInputs)
    if fill_model and not has_inputs:
        raise ConfigError(
            f"the {where} conditioning has no inpainting image and mask for a FLUX.1 Fill model",
            "Fill reads the image to complete and the mask of what to repaint as extra input channels",
            "give each conditioning FluxFillInputs (InpaintModelConditioning's concat_latent_image and concat_mask)",
        )
    if has_inputs and not fill_model:
        raise ConfigError(
            f"the {where} conditioning carries an inpainting image and mask for a FLUX.1 model without extra "
            "input channels",
            "only FLUX.1 Fill (384 input features) reads them; this model would ignore them",
            "load flux1-fill-dev, or inpaint with the noise mask only",
        )


COMFY_CONDITIONING = ComfyConditioning(KEYS, flux_extras, fill_extras_fit)
