"""What a transformer's diffusers config says of its size (heads, blocks, text widths), whatever a family calls the
entries: the layout planner, PipeFusion's weight budget and the conditioning checks read it through
``ModelAdapter.config_sizes``, whose default is :func:`standard_config_sizes`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

TEXT_DIM_KEYS = ("joint_attention_dim", "caption_channels", "cross_attention_dim", "text_dim", "text_embed_dim")


@dataclasses.dataclass(frozen=True)
class ConfigSizes:
    """A transformer's size as its config states it."""

    heads: int  # attention heads
    head_dim: int  # width of one head
    blocks: int  # blocks in the plan's block lists (what PipeFusion splits)
    text_dim: int | None  # width of the text embeddings the transformer takes (None: unknown)
    pooled_dim: int | None  # width of the pooled text vector it takes (None: none)

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


def standard_config_sizes(config: Mapping[str, Any]) -> ConfigSizes:
    """The sizes under the names most diffusers transformers use (``num_attention_heads``, ``attention_head_dim``,
    ``num_layers`` + ``num_single_layers``, ``joint_attention_dim`` & co., ``pooled_projection_dim``)."""
    heads = int(config.get("num_attention_heads") or 0)
    blocks = int(config.get("num_layers") or 0) + int(config.get("num_single_layers") or 0)
    text = next((int(config[k]) for k in TEXT_DIM_KEYS if config.get(k)), None)
    pooled = config.get("pooled_projection_dim")
    return ConfigSizes(heads, int(config.get("attention_head_dim") or 0), blocks, text, pooled and int(pooled))
