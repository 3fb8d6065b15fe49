"""What Qwen-Image takes from a ComfyUI CONDITIONING beyond text: Qwen-Image-Edit's reference images.

Qwen-Image-Edit (and its 2509 "Plus" with several images) is a Qwen-Image transformer trained to read reference
images that ride in the token sequence; ComfyUI gives every Qwen-Image model the references a conditioning
carries (``TextEncodeQwenImageEdit`` / ``TextEncodeQwenImageEditPlus`` put the VAE-encoded images there, as
does ``ReferenceLatent``). A reference's ids are centred like the image's own, (index, row + r - rows // 2,
column + c - cols // 2); the default placement is ``index`` (reference k has frame index k, see
``models.reference_latents``). Light to import: torch is imported on call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..spec import ComfyConditioning

PACK = 2  # 2x2 latent pixels per token, channel order (c, p, q)
KEYS = ("reference_latents", "reference_latents_method")


def edit_ids(index: int, row: int, col: int, rows: int, cols: int):
    """Qwen-Image position ids [rows*cols, 3] of a reference: (index, centred row, centred column), row-major."""
    import torch

    ids = torch.zeros(rows, cols, 3)
    ids[..., 0] = index
    ids[..., 1] = (torch.arange(rows, dtype=torch.float32) + row - rows // 2)[:, None]
    ids[..., 2] = (torch.arange(cols, dtype=torch.float32) + col - cols // 2)[None, :]
    return ids.reshape(rows * cols, 3)


def reference_images(options: Mapping[str, Any], expected: Mapping[str, int | None], where: str):
    """The ``ReferenceLatents`` of one entry's ``options`` (None when it has none)."""
    from ...reference_latents import from_options

    return from_options(
        options, expected, where, label="Qwen-Image", patch=PACK, layout="cpq", default_method="index", ids_of=edit_ids
    )


COMFY_CONDITIONING = ComfyConditioning(KEYS, reference_images)
