"""What HunyuanVideo 1.5 adds to the shared Conditioning: the ByT5 states of the prompt's quoted (glyph) text."""

from __future__ import annotations

import dataclasses

import torch

from ....errors import ConfigError
from ...base import Conditioning, ConditioningExtras


@dataclasses.dataclass(frozen=True)
class GlyphText(ConditioningExtras):
    """ByT5's states of the quoted text of each prompt ([B, T2, D2]; T2 may be 0) and their mask ([B, T2], None
    when every prompt keeps them all)."""

    byt5: torch.Tensor | None = None
    byt5_mask: torch.Tensor | None = None


def glyph_text(cond: Conditioning) -> GlyphText:
    extras = cond.extras
    if extras is None:
        return GlyphText()
    if not isinstance(extras, GlyphText):
        raise ConfigError(
            f"conditioning with {type(extras).__name__} given to a HunyuanVideo 1.5 model",
            "a family's extra conditioning inputs belong to that family's model",
            "encode the prompt for this HunyuanVideo 1.5 model (Parallel Text Encode)",
        )
    return extras
