"""What FLUX.1 takes from a ComfyUI CONDITIONING beyond text: Kontext's reference images (``ReferenceLatent``).

FLUX.1 Kontext [dev] is a FLUX.1 dev transformer (same tensors) trained to read reference images that ride
in the token sequence; ComfyUI gives every FLUX.1 model the references a conditioning carries. Their ids are
(index, row + row offset, column + column offset), rows and columns counted from 0 as the image's own; the
default placement is ``offset`` (see ``models.reference_latents``). Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..spec import ComfyConditioning

PACK = 2  # 2x2 latent pixels per token, channel order (c, p, q)
KEYS = ("reference_latents", "reference_latents_method")


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


COMFY_CONDITIONING = ComfyConditioning(KEYS, reference_images)
