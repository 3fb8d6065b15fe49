"""Prompts of different token counts in one batch: the padding every prompt masks out is dropped, and the rest
of the mask is only allowed where attention applies it (not under split or stale attention)."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .base import Activations


def strip_text_padding(text: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(text, mask) without the trailing tokens every prompt of the batch masks out; mask None when the
    rest is all kept. Exact: a masked token is never attended to and dropping trailing tokens moves none."""
    if mask is None:
        return text, None
    keep = mask.to(torch.bool)
    valid = keep.any(dim=0).nonzero()
    length = int(valid.max()) + 1 if valid.numel() else 1
    text, keep = text[:, :length], keep[:, :length]
    return text, (None if bool(keep.all()) else keep)


def check_mask_layout(acts: Activations, mesh, model: str) -> None:
    """A ConfigError when ``acts`` carry a text mask under sequence parallelism or PipeFusion (``model``: the
    model's name, for the message)."""
    if acts.txt_mask is not None and (mesh.size("sp") > 1 or mesh.size("pp") > 1):
        raise ConfigError(
            f"a batch of {model} prompts with different token counts under sequence parallelism or PipeFusion",
            "the shorter prompts' padding must be masked, and split (or stale) attention applies no mask",
            "encode one prompt per batch (ComfyUI's text encode does), or use a layout without ulysses/ring/pipefusion",
        )
