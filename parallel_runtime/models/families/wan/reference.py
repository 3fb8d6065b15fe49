"""Wan Fun-Control's reference image: one clean latent frame that rides in the token sequence.

``Wan22FunControlToVideo``'s ``ref_image`` is VAE-encoded at the video's size and appended to the
conditioning's ``reference_latents``; a file with a reference-image patch embedding (``ref_conv``: a 2-D conv of
the patch's 2x2 pixels, 16 latent channels -> the model width) reads the last one's first frame, in model space.
Its tokens join the video's in self-attention as one extra frame: the rotary positions are those of a video one
frame longer, the reference taking frame 0 and the video frames 1..T. Its prediction is dropped.

Here the reference tokens follow the video's (``Activations.ref_tokens``), which the layouts already carry for
edit models: attention does not depend on the order of the tokens, only on their positions. The diffusers
class has no ``ref_conv``: the adapter adds it (``extra_modules``) when the file's config says it has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...base import LatentFormat
from ...latent_batch import repeated_to_batch
from .keys import REF_CONV_KEY

MODULE = "ref_conv"


def extra_modules(config: Mapping[str, Any]) -> dict[str, nn.Module]:
    """The reference-image patch embedding a Fun-Control file holds (``config[REF_CONV_KEY]`` channels in)."""
    channels = config.get(REF_CONV_KEY)
    if not channels:
        return {}
    _, ph, pw = config["patch_size"]
    width = config["num_attention_heads"] * config["attention_head_dim"]
    return {MODULE: nn.Conv2d(int(channels), width, kernel_size=(ph, pw), stride=(ph, pw))}


def reference_tokens(
    transformer: nn.Module, reference: torch.Tensor, x: torch.Tensor, fmt: LatentFormat, per_frame_time: bool
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(reference tokens [B, R, D], their rotary rows, the video's rotary rows shifted one frame on) for the
    raw reference latent ``reference`` [B or 1, 16, H, W] and the (padded) video latent ``x`` [B, C, T, H, W]."""
    conv = getattr(transformer, MODULE, None)
    if conv is None:
        raise ConfigError(
            "a reference image (reference_latents) for a Wan model without a reference-image embedding",
            "only Wan Fun-Control files with a ref_conv read Wan22FunControlToVideo's ref_image; this model would "
            "ignore it (ComfyUI does, silently)",
            "load a Wan 2.2 Fun-Control (or Fun v1.1) file with ref_conv, or leave ref_image unconnected",
        )
    if per_frame_time:
        raise ConfigError(
            "a reference image (reference_latents) with a per-frame timestep Wan model (TI2V-5B)",
            "the reference frame would need a timestep of its own; no published model combines them",
            "leave ref_image unconnected for this model",
        )
    if tuple(reference.shape[-2:]) != tuple(x.shape[-2:]):
        raise ConfigError(
            f"a reference latent of {tuple(reference.shape[-2:])} (height, width) for a video latent of "
            f"{tuple(x.shape[-2:])}",
            "the reference takes the positions of one video frame (Wan22FunControlToVideo resizes it to the video)",
            "give the reference image the video's width and height (the node does this), in whole 16-pixel tokens",
        )
    reference = repeated_to_batch(
        reference,
        x.shape[0],
        "a reference latent",
        "each latent needs its reference image (or one shared by all)",
        "use one reference image, or as many as latents",
    )
    ref = fmt.to_model(reference.to(x.device, torch.float32))
    tokens = conv(ref.to(conv.weight.dtype)).flatten(2).transpose(1, 2).to(x.dtype)
    reference_rope, video_rope = rope_after_reference(transformer, x)
    return tokens, reference_rope, video_rope


def rope_after_reference(
    transformer: nn.Module, x: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(the reference frame's rotary rows, the video's) of a video one frame longer than ``x``: frame 0 is the
    reference's. A PipeFusion patch that reads the reference's kept K/V takes the video's alone."""
    longer = torch.empty((1, 1, x.shape[2] + 1, *x.shape[3:]), device="meta")
    rope = transformer.rope(longer)  # (cos, sin) [1, (T + 1) * per_frame, 1, d]
    first = rope[0].shape[1] // (x.shape[2] + 1)
    return tuple(r[:, :first] for r in rope), tuple(r[:, first:] for r in rope)
