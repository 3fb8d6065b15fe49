"""A T5 encoder stack (T5 v1.1 / UMT5: gated-GELU feed-forward, RMS norms, relative position buckets) whose
module names follow the original checkpoints' key layout (``shared.weight``,
``encoder.block.N.layer.0.SelfAttention.q.weight``, ``encoder.block.N.layer.1.DenseReluDense.wi_0.weight``,
``encoder.final_layer_norm.weight``), so a text-encoder file's tensors load by their own names.

Activations are float32 whatever the weights are held in (each Linear's weight is brought to float32 per call:
T5 overflows in float16, and ComfyUI runs its T5 encoders this way). T5 v1.1 has one relative-position table,
in the first block, shared by all; UMT5 has one per block. Attention is unscaled (T5 folds the 1/sqrt(d) into
its initialisation), with the position bias and the padding mask added to the scores.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

NEG = -torch.finfo(torch.float32).max  # the score of a padded key


@dataclasses.dataclass(frozen=True)
class T5Sizes:
    """What a T5 encoder file's tensors show of its shape."""

    vocab: int
    width: int  # d_model
    inner: int  # heads x head width
    heads: int
    ff: int  # d_ff
    blocks: int
    buckets: int = 32  # relative-position buckets
    max_distance: int = 128  # relative positions this far and beyond share the last bucket
    bias_per_block: bool = False  # UMT5: each block has its own position table
    eps: float = 1e-6


def compute_linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` in ``x``'s dtype: a plain Linear's weight is cast per call (fp8 / GGUF layers do it)."""
    if type(layer) is nn.Linear:
        return F.linear(x, layer.weight.to(x.dtype))
    return layer(x)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight.to(x.dtype)


def position_buckets(length: int, buckets: int, max_distance: int, device: torch.device) -> torch.Tensor:
    """[query, key] bucket of (key - query): half the buckets per direction; within each, exact distances up
    to a quarter of the buckets, then logarithmic bins up to ``max_distance``."""
    pos = torch.arange(length, device=device)
    rel = pos[None, :] - pos[:, None]
    half = buckets // 2
    exact = half // 2
    distance = rel.abs()
    far = exact + (torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (half - exact))
    far = far.long().clamp(max=half - 1)
    return torch.where(distance < exact, distance, far) + (rel > 0).long() * half


class SelfAttention(nn.Module):
    def __init__(self, sizes: T5Sizes, has_table: bool):
        super().__init__()
        self.heads = sizes.heads
        self.q, self.k, self.v = (nn.Linear(sizes.width, sizes.inner, bias=False) for _ in range(3))
        self.o = nn.Linear(sizes.inner, sizes.width, bias=False)
        if has_table:
            self.relative_attention_bias = nn.Embedding(sizes.buckets, sizes.heads)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (compute_linear(p, x).view(b, n, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        return compute_linear(self.o, out.transpose(1, 2).reshape(b, n, -1))


class AttentionLayer(nn.Module):
    def __init__(self, sizes: T5Sizes, has_table: bool):
        super().__init__()
        self.SelfAttention = SelfAttention(sizes, has_table)
        self.layer_norm = RMSNorm(sizes.width, sizes.eps)


class GatedGelu(nn.Module):
    def __init__(self, sizes: T5Sizes):
        super().__init__()
        self.wi_0 = nn.Linear(sizes.width, sizes.ff, bias=False)
        self.wi_1 = nn.Linear(sizes.width, sizes.ff, bias=False)
        self.wo = nn.Linear(sizes.ff, sizes.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.gelu(compute_linear(self.wi_0, x), approximate="tanh")
        return compute_linear(self.wo, gate * compute_linear(self.wi_1, x))


class FeedForwardLayer(nn.Module):
    def __init__(self, sizes: T5Sizes):
        super().__init__()
        self.DenseReluDense = GatedGelu(sizes)
        self.layer_norm = RMSNorm(sizes.width, sizes.eps)


class T5EncoderBlock(nn.Module):
    def __init__(self, sizes: T5Sizes, has_table: bool):
        super().__init__()
        self.sizes = sizes
        self.layer = nn.ModuleList([AttentionLayer(sizes, has_table), FeedForwardLayer(sizes)])

    def position_bias(self, length: int, device: torch.device) -> torch.Tensor:
        """[1, heads, length, length] from this block's table."""
        table = self.layer[0].SelfAttention.relative_attention_bias
        buckets = position_buckets(length, self.sizes.buckets, self.sizes.max_distance, device)
        return table.weight.to(device=device, dtype=torch.float32)[buckets].permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, shared_bias: torch.Tensor | None) -> torch.Tensor:
        attn, ff = self.layer
        bias = shared_bias if shared_bias is not None else self.position_bias(x.shape[1], x.device)
        x = x + attn.SelfAttention(attn.layer_norm(x), bias.to(x.device) + mask.to(x.device))
        return x + ff.DenseReluDense(ff.layer_norm(x))


class T5EncoderStack(nn.Module):
    def __init__(self, sizes: T5Sizes):
        super().__init__()
        self.block = nn.ModuleList(T5EncoderBlock(sizes, i == 0 or sizes.bias_per_block) for i in range(sizes.blocks))
        self.final_layer_norm = RMSNorm(sizes.width, sizes.eps)


class T5TextEncoder(nn.Module):
    """The encoder half of a T5 / UMT5 checkpoint: token ids (+ mask) -> last hidden states (float32)."""

    _no_split_modules = ["T5EncoderBlock"]  # accelerate moves whole blocks when spread over GPUs

    def __init__(self, sizes: T5Sizes):
        super().__init__()
        self.sizes = sizes
        self.shared = nn.Embedding(sizes.vocab, sizes.width)
        self.encoder = T5EncoderStack(sizes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.shared.weight[input_ids.to(self.shared.weight.device)].to(torch.float32)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = torch.where(attention_mask.to(x.device).bool(), 0.0, NEG)[:, None, None, :]
        shared = None
        if not self.sizes.bias_per_block:
            shared = self.encoder.block[0].position_bias(x.shape[1], x.device)
        for block in self.encoder.block:
            x = block(x, mask, shared)
        return self.encoder.final_layer_norm(x.to(self.encoder.final_layer_norm.weight.device))
