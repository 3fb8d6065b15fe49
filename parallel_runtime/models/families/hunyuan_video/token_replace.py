"""HunyuanVideo-I2V "token replace" (ComfyUI's HunyuanImageToVideo "v2 (replace)"): the start frame's image tokens
take their own modulation.

The start image's latent sits clean on the first latent frame (the LATENT's noise mask keeps it). Its tokens are
modulated with a second conditioning vector, that of the guiding timestep (0: a clean frame) with the same pooled
text and embedded guidance; every other token, and the text, keeps the step's vector. As ComfyUI 0.3.64 runs it,
the second vector also holds the embedded guidance and also modulates the output layer (diffusers' token-replace
blocks leave both out: its pipeline discards the first frame's prediction, so only the guidance differs there).

Which tokens are the first frame's is a fact of position, so it rides with the rotary table: the image rope becomes
(cos, sin, first) with ``first`` [S, 1] True on the first frame's tokens. The tables are cut to PipeFusion bands and
split over sequence-parallel ranks with the tokens, so every rank selects by its tokens' global positions (the first
frame may lie on one rank, or across several). ``temb`` / ``temb_out`` become [B, 2, D]: (step, guiding frame).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

TOKEN_REPLACE_BLOCKS = ("HunyuanVideoTokenReplaceTransformerBlock", "HunyuanVideoTokenReplaceSingleTransformerBlock")


def first_frame_flags(frames: int, rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """[frames * rows * cols, 1] True on the first frame's tokens (row-major over frames, rows, cols)."""
    flags = torch.zeros(frames, rows * cols, 1, dtype=torch.bool, device=device)
    flags[0] = True
    return flags.flatten(0, 1)


def _modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, first: torch.Tensor | None) -> torch.Tensor:
    """x * (1 + scale) + shift with each token's row of scale / shift ([B, D] or [B, 2, D]: step, guiding)."""
    if scale.ndim == 2:
        return x * (1 + scale[:, None]) + shift[:, None]
    step = x * (1 + scale[:, :1]) + shift[:, :1]
    guiding = x * (1 + scale[:, 1:]) + shift[:, 1:]
    return torch.where(first, guiding, step)


def _gate(x: torch.Tensor, gate: torch.Tensor, first: torch.Tensor | None) -> torch.Tensor:
    if gate.ndim == 2:
        return x * gate[:, None]
    return torch.where(first, x * gate[:, 1:], x * gate[:, :1])


def _steps(temb: torch.Tensor) -> torch.Tensor:
    """The step's conditioning vector [B, D] (the text's, and every token's without a guiding frame)."""
    return temb[:, 0] if temb.ndim == 3 else temb


def double_block(
    block: nn.Module,
    img: torch.Tensor,
    txt: torch.Tensor,
    temb: torch.Tensor,
    mask: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor],
    first: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A double-stream block (either diffusers class: the same sub-modules) with per-token image modulation."""
    shift1, scale1, gate1, shift2, scale2, gate2 = block.norm1.linear(F.silu(temb)).chunk(6, dim=-1)
    norm_img = _modulate(block.norm1.norm(img), scale1, shift1, first)
    norm_txt, c_gate1, c_shift2, c_scale2, c_gate2 = block.norm1_context(txt, emb=_steps(temb))
    attn, c_attn = block.attn(
        hidden_states=norm_img, encoder_hidden_states=norm_txt, attention_mask=mask, image_rotary_emb=rope
    )
    img = img + _gate(attn, gate1, first)
    txt = txt + c_attn * c_gate1.unsqueeze(1)
    norm_img = _modulate(block.norm2(img), scale2, shift2, first)
    norm_txt = block.norm2_context(txt) * (1 + c_scale2[:, None]) + c_shift2[:, None]
    img = img + _gate(block.ff(norm_img), gate2, first)
    txt = txt + c_gate2.unsqueeze(1) * block.ff_context(norm_txt)
    return img, txt


def single_block(
    block: nn.Module,
    img: torch.Tensor,
    txt: torch.Tensor,
    temb: torch.Tensor,
    mask: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor],
    first: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A single-stream block over [image, text] with per-token modulation (text tokens take the step's)."""
    tokens = img.shape[1]
    x = torch.cat([img, txt], dim=1)
    if first is not None:
        first = torch.cat([first, first.new_zeros(txt.shape[1], 1)])
    shift, scale, gate = block.norm.linear(F.silu(temb)).chunk(3, dim=-1)
    norm = _modulate(block.norm.norm(x), scale, shift, first)
    mlp = block.act_mlp(block.proj_mlp(norm))
    attn, c_attn = block.attn(
        hidden_states=norm[:, :tokens],
        encoder_hidden_states=norm[:, tokens:],
        attention_mask=mask,
        image_rotary_emb=rope,
    )
    out = block.proj_out(torch.cat([torch.cat([attn, c_attn], dim=1), mlp], dim=2))
    x = _gate(out, gate, first) + x
    return x[:, :tokens], x[:, tokens:]


def output_norm(norm_out: nn.Module, img: torch.Tensor, temb: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """The output layer's adaptive norm (``AdaLayerNormContinuous``: scale before shift) per token."""
    scale, shift = norm_out.linear(norm_out.silu(temb).to(img.dtype)).chunk(2, dim=-1)
    return _modulate(norm_out.norm(img), scale, shift, first)
