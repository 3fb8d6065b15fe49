"""The original T5 / UMT5 checkpoints' key layout (``shared.weight``, ``encoder.block.N.layer.0.SelfAttention.q.weight``,
``encoder.block.N.layer.1.DenseReluDense.wi_0.weight``, ``encoder.final_layer_norm.weight``): the encoder's sizes
read from a file's tensor shapes under those names (safetensors files hold them so; GGUF files are mapped to
them)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..errors import ConfigError
from .t5_encoder import T5Sizes

ANCHOR = "encoder.block.0.layer.0.SelfAttention.q.weight"


def t5_sizes(shapes: Mapping[str, tuple[int, ...]], name: str, what: str = "T5") -> T5Sizes:
    """The encoder's sizes from a file's tensor shapes (original key layout); a ConfigError when the file
    does not hold a T5 v1.1 / UMT5 encoder (``name``: the file, ``what``: the encoder the caller expects)."""
    needed = ["shared.weight", ANCHOR, "encoder.final_layer_norm.weight"]
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise ConfigError(
            f"{name} does not hold a {what} text encoder (no {missing[0]})",
            f"a {what} encoder file stores shared.weight and encoder.block.N.layer... tensors (the original "
            "checkpoints' layout, as ComfyUI's CLIPLoader reads it)",
            f"pick the {what} encoder file (e.g. umt5_xxl_fp16.safetensors / t5xxl_fp16.safetensors)",
        )
    if _ff(0, "wi_0") not in shapes and _ff(0, "wi") in shapes:
        raise ConfigError(
            f"{name} is an original T5 (v1.0) encoder with a single ReLU feed-forward",
            "only the gated-GELU T5 v1.1 / UMT5 encoders (T5-XXL, UMT5-XXL) are read",
            "use t5xxl_fp16.safetensors / umt5_xxl_*.safetensors",
        )
    vocab, width = shapes["shared.weight"]
    table = _attn(0, "relative_attention_bias")
    if table not in shapes:
        raise ConfigError(
            f"{name} has no {table}",
            "the first block of a T5 encoder holds its relative-position table",
            "use the complete encoder file",
        )
    buckets, heads = shapes[table]
    blocks = 1 + max(int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.block\.(\d+)\.", k)))
    return T5Sizes(
        vocab=vocab,
        width=width,
        inner=shapes[ANCHOR][0],
        heads=heads,
        ff=shapes[_ff(0, "wi_0")][0],
        blocks=blocks,
        buckets=buckets,
        bias_per_block=_attn(1, "relative_attention_bias") in shapes,
    )


def _attn(block: int, part: str) -> str:
    return f"encoder.block.{block}.layer.0.SelfAttention.{part}.weight"


def _ff(block: int, part: str) -> str:
    return f"encoder.block.{block}.layer.1.DenseReluDense.{part}.weight"
