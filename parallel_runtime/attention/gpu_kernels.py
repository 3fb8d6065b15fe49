"""CUDA attention kernels beyond torch's default SDPA: SageAttention, FlashAttention 3 and cuDNN SDPA.

Same calls as every kernel of the registry (``kernels.py``), on [B, H, S, D]: ``attend(q, k, v, scale)``, and
``*_lse(q, k, v, scale) -> (out, lse)``, or None where the kernel cannot give the logsumexp Ring attention
merges with (a FlashAttention 3 build without it, cuDNN refusing the inputs; SageAttention has none at all):
the registry then attends that Ring block with torch SDPA. The packages are imported when a kernel first runs
(their availability was checked by the registry).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


# -- SageAttention (INT8 Q.K^T, FP16/FP8 P.V; https://github.com/thu-ml/SageAttention) -------------------------
def sage_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """sageattention.sageattn on the [B, H, S, D] ("HND") layout."""
    from sageattention import sageattn

    return sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=scale)


# -- FlashAttention 3 (Hopper; the flash_attn_interface module of flash-attn's hopper build) ---------------------
def _flash3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None):
    from flash_attn_interface import flash_attn_func

    res = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale, causal=False)
    out, lse = (res[0], res[1]) if isinstance(res, tuple) else (res, None)
    return out.transpose(1, 2), lse


def flash3_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    return _flash3(q, k, v, scale)[0]


def flash3_attend_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    out, lse = _flash3(q, k, v, scale)
    return None if lse is None else (out, lse[..., : q.shape[2]].float())


# -- cuDNN attention through torch ---------------------------------------------------------------------------
def cudnn_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """torch SDPA restricted to its cuDNN backend (falls back to torch's choice when cuDNN refuses the inputs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=scale)
    except RuntimeError:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)


def cudnn_attend_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    try:
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False, scale=scale)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return res[0], res[1].reshape(q.shape[0], q.shape[1], -1)[..., : q.shape[2]].float()
