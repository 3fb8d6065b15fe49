"""HunyuanImageToVideo "custom" (``ref_latent``): the start image's latent as extra image tokens.

As ComfyUI 0.3.64 places them: the reference latent (in model space) through the patch embedding, its tokens at
frame position -1 and, on the width axis, beside the video (column + the video's token columns); they take part in
every block's attention and are dropped before the output layer. They ride after the video's tokens
(``Activations.ref_tokens``): joint attention does not depend on the order, only on the positions.
"""

from __future__ import annotations

import torch
from torch import nn

from ....errors import ConfigError
from ...latent_batch import repeated_to_batch
from ...latent_formats import LatentFormat


def reference_tokens(
    transformer: nn.Module, ref_raw: torch.Tensor, x: torch.Tensor, fmt: LatentFormat
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(tokens [B, R, D], their rotary (cos, sin) rows [R, d]) of the raw reference latent [B or 1, C, T', H', W']
    beside the video latent ``x`` [B, C', T, H, W]."""
    p = transformer.config.patch_size
    if ref_raw.shape[1] != x.shape[1] and ref_raw.shape[1] != fmt.channels:
        raise ConfigError(
            f"a reference latent of {ref_raw.shape[1]} channels for a {x.shape[1]}-channel HunyuanVideo latent",
            "HunyuanImageToVideo 'custom' embeds the start image's latent like a video frame",
            "use HunyuanImageToVideo with the HunyuanVideo VAE and the 16-channel model",
        )
    ref_raw = repeated_to_batch(
        ref_raw,
        x.shape[0],
        "a reference latent",
        "each latent needs its reference (or one shared by all)",
        "use one start image, or as many as latents",
    )
    ref = fmt.to_model(ref_raw.to(x.device, x.dtype))
    tokens = transformer.x_embedder(ref)
    frames, rows, cols = ref.shape[2], ref.shape[3] // p, ref.shape[4] // p
    beside = x.shape[-1] // p  # the video's token columns: the reference's columns start there
    grid = torch.empty((1, 0, 2, rows * p, (beside + cols) * p), device=x.device)
    cos, sin = (t.reshape(2, rows, beside + cols, -1)[1, :, beside:].flatten(0, 1) for t in transformer.rope(grid))
    sin = sin.clone()
    sin[:, : transformer.config.rope_axes_dim[0]] *= -1  # frame position -1: sin(-a) = -sin(a), cos(-a) = cos(a)
    return tokens, (cos.repeat(frames, 1), sin.repeat(frames, 1))
