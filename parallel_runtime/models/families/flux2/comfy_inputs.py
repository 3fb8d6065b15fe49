"""What FLUX.2 takes from a CONDITIONING beyond text: reference images (``reference_latents``).

FLUX.2 reads reference images in the token sequence, as Flux2Pipeline's ``image=`` does (ComfyUI 0.3.64 has no
FLUX.2, so diffusers is the oracle): each reference is a FLUX.2 LATENT (the packed 128-channel latent, one token
per latent pixel) appended after the image's tokens, reference ``k`` (counting from 1) at time coordinate
``10 * k`` with rows and columns counted from 0: ids (10 k, row, col, 0). That is the ``index`` placement of
``models.reference_latents`` (FLUX.2's only one: the ``offset`` box has no FLUX.2 convention). Light to import:
torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ....errors import ConfigError
from ..spec import ComfyConditioning

KEYS = ("reference_latents", "reference_latents_method")
TIME_STEP = 10  # Flux2Pipeline's ``_prepare_image_ids`` scale: reference k sits at t = 10 k


def reference_ids(index: int, row: int, col: int, rows: int, cols: int):
    """FLUX.2 position ids [rows*cols, 4] of reference ``index``: (10 index, row + r, col + c, 0), row-major."""
    import torch

    ids = torch.zeros(rows, cols, 4)
    ids[..., 0] = TIME_STEP * index
    ids[..., 1] = torch.arange(row, row + rows, dtype=torch.float32)[:, None]
    ids[..., 2] = torch.arange(col, col + cols, dtype=torch.float32)[None, :]
    return ids.reshape(rows * cols, 4)


def reference_images(options: Mapping[str, Any], expected: Mapping[str, int | None], where: str):
    """The ``ReferenceLatents`` of one entry's ``options`` (None when it has none)."""
    from ...reference_latents import from_options

    method = options.get("reference_latents_method")
    if options.get("reference_latents") is not None and method not in (None, "index"):
        raise ConfigError(
            f"the {where} conditioning's reference_latents_method is {method!r} for a FLUX.2 model",
            "FLUX.2 places reference k at its own time coordinate (10 k), as Flux2Pipeline does; it has no offset "
            "placement",
            "remove FluxKontextMultiReferenceLatentMethod or set it to index",
        )
    return from_options(
        options, expected, where, label="FLUX.2", patch=1, layout="pqc", default_method="index", ids_of=reference_ids
    )


COMFY_CONDITIONING = ComfyConditioning(KEYS, reference_images)
