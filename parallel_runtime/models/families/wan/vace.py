"""Wan VACE: WanVaceToVideo's control entries as context tokens whose hint blocks add to the video tokens.

A VACE file (diffusers' ``WanVACETransformer3DModel``) holds, beside a Wan transformer, the patch embedding of
a 96-channel context (per latent position: the inactive and the reactive control-video latents in model space,
then the 64-channel mask of 8x8 pixels) and hint blocks. Hint block ``n`` runs beside main block
``vace_layers[n]``: it carries the context's token stream one block further (the first one adds the projected
context to the patch-embedded latent) and returns a hint that is added, times the entry's strength, to the
video tokens after that main block.

Everything is per token, at the video tokens' positions with their RoPE: under Ulysses / Ring each rank runs the
hint blocks on the context tokens of the video tokens it holds (their self-attention is routed like the main
blocks'), under CFG parallel each branch on its own rank with its own entries. Entries of chained WanVaceToVideo
nodes each run through the hint blocks; their hints add up. A VACE model given no entry reads one zero control
video with a mask of ones at strength 1, as ComfyUI does.

Under PipeFusion the control streams are cut into the patch's row band with the video tokens (``embed_rows``)
and travel with the patch from stage to stage; each stage loads and runs the hint blocks of its own main blocks
(``WanAdapter.companion_prefixes``), their self-attention over stale K/V of the whole video like the main
blocks' (a buffer per hint block and entry: ``stale_kv.StaleKVCache.call_key``). Cost per hop and item: one
more [rows, band tokens, width] tensor per entry beside the video tokens (the patch-embedded latent, read only by
the first hint block, stays on the stage that runs it: ``WanAdapter.spent_fields``); no stage ever holds the
control tokens of other patches than in its K/V buffers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ....errors import ConfigError
from ...base import LatentFormat
from .concat import fit_to_latent
from .conditioning import WanImageInputs

VIDEO_CHANNELS = 32  # inactive + reactive control video latents (16 each)
MASK_CHANNELS = 64  # the 8x8 pixels of a latent position, one channel each


def hint_blocks(transformer: nn.Module) -> dict[int, nn.Module]:
    """id(main block) -> the hint block that runs after it (empty for a transformer without VACE)."""
    hints = getattr(transformer, "vace_blocks", None)
    if hints is None:
        return {}
    after = transformer.config.vace_layers
    return {id(transformer.blocks[i]): hints[n] for n, i in enumerate(after)}


def entries(inputs: WanImageInputs, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[float, ...]]:
    """(frames [B, N, 32, ...], mask [B, N, 64, ...], strengths) of the conditioning, or ComfyUI's default
    entry (zero video, mask of ones, strength 1) at ``x``'s size when it has none."""
    if inputs.vace_frames is not None:
        return inputs.vace_frames, inputs.vace_mask, inputs.vace_strength
    size = x.shape[2:]
    return x.new_zeros(1, 1, VIDEO_CHANNELS, *size), x.new_ones(1, 1, MASK_CHANNELS, *size), (1.0,)


def context_tokens(
    embed: nn.Module,
    x: torch.Tensor,
    inputs: WanImageInputs,
    fmt: LatentFormat,
    pad: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[tuple[torch.Tensor, ...], tuple[float, ...]]:
    """Each entry's context tokens [B, S, D] (``embed``: the file's ``vace_patch_embedding``) and strengths;
    ``x`` is the latent, maybe padded to whole tokens by ``pad`` (which pads the context the same way)."""
    frames, mask, strengths = entries(inputs, x)
    out = []
    for n in range(frames.shape[1]):
        video = frames[:, n].to(x.device, x.dtype)
        video = torch.cat([fmt.to_model(part) for part in video.split(fmt.channels, dim=1)], dim=1)
        context = torch.cat([video, mask[:, n].to(x.device, x.dtype)], dim=1)
        padded = pad(context)
        if padded.shape[2:] != x.shape[2:]:
            raise ConfigError(
                f"the conditioning's vace_frames are {tuple(context.shape[2:])} (frames, height, width) for a "
                f"latent of {tuple(x.shape[2:])} (padded to whole tokens)",
                "VACE's control tokens sit at the video tokens' positions, one for one",
                "sample the latent WanVaceToVideo made (same width, height, length and reference image)",
            )
        context = fit_to_latent(padded, x, "vace_frames")
        out.append(embed(context).flatten(2).transpose(1, 2))
    return tuple(out), tuple(float(s) for s in strengths)


def run_hints(hint: nn.Module, img: torch.Tensor, acts) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``img`` after main block ``hint`` follows plus each entry's hint times its strength; the next streams."""
    x0, *streams = acts.control
    carried = []
    for stream, strength in zip(streams, acts.control_scale, strict=True):
        out, stream = hint(x0, acts.txt, stream, acts.temb, acts.img_rope)
        img = img + out * strength
        carried.append(stream)
    return img, (x0, *carried)


def check_entries(frames: torch.Tensor, mask: torch.Tensor, strengths: tuple[float, ...], role: str) -> None:
    """Frames, mask and strengths of one conditioning: as many of each, of the widths a VACE model reads."""
    if (
        frames.shape[2] != VIDEO_CHANNELS
        or mask.shape[2] != MASK_CHANNELS
        or frames.shape[:2] != mask.shape[:2]
        or frames.shape[3:] != mask.shape[3:]
        or len(strengths) != frames.shape[1]
    ):
        raise ConfigError(
            f"the {role} conditioning's VACE entries: vace_frames {tuple(frames.shape)}, vace_mask "
            f"{tuple(mask.shape)}, {len(strengths)} strengths",
            "each WanVaceToVideo entry is a 32-channel control latent, a 64-channel mask of the same frames and "
            "size, and one strength",
            "use WanVaceToVideo's conditioning as it makes it (with a Wan 2.1 VAE)",
        )
