"""Sequence-parallel attention (USP = Ulysses x Ring) with selectable kernels.

CONTRACT (used by the model adapters):
- ``SequenceParallelAttention(mesh, backend)`` is called like ``F.scaled_dot_product_attention``
  with q, k, v of shape [B, H, S_local, D], where S_local is this rank's share of the token
  sequence split over the mesh's "sp" dimension (ranks may hold different counts).
- ``with attn.intercept():`` routes every ``torch.nn.functional.scaled_dot_product_attention``
  call made inside the scope to ``attn``; adapters enter it only around self/joint attention
  modules (never cross-attention, whose K/V are the replicated text tokens).

This stub computes single-rank attention; the distributed path is filled in separately.
"""

from __future__ import annotations

import contextlib

import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .errors import ConfigError
from .mesh import ParallelMesh

ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "sdpa", "flash")


def check_backend(name: str) -> str:
    if name not in ATTENTION_BACKENDS:
        raise ConfigError(
            f"unknown attention backend {name!r}",
            "the backend picks the attention kernel",
            f"use one of: {', '.join(ATTENTION_BACKENDS)}",
        )
    return name


class SequenceParallelAttention:
    """Attention over a sequence split across the mesh's sp group (Ulysses x Ring)."""

    def __init__(self, mesh: ParallelMesh, backend: str = "auto"):
        self.mesh = mesh
        self.backend = check_backend(backend)

    def __call__(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)

    @contextlib.contextmanager
    def intercept(self):
        """Route F.scaled_dot_product_attention calls inside this scope to this object."""
        with _SdpaRedirect(self):
            yield


class _SdpaRedirect(TorchFunctionMode):
    def __init__(self, attn: SequenceParallelAttention):
        super().__init__()
        self.attn = attn

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self.attn(*args, **kwargs)
        return func(*args, **kwargs)
