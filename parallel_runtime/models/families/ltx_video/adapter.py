"""LTX-Video 0.9 (LTXVideoTransformer3DModel): video tokens, 3-axis rotary positions, cross-attention to T5 text.

A latent [B, 128, T, H, W] becomes one token per latent pixel (patch 1: ``proj_in`` on the channels), row-major
over (T, H, W). The tokens and their rotary (cos, sin) rows are split over "sp"; the projected T5 text stays
replicated: it is the K/V of the cross-attention ``attn2``, which runs outside the sequence-parallel intercept.

Rotary positions: a token's latent coordinates (frame, row, col) are scaled to pixel coordinates by the VAE's
factors (8 frames, 32 px), the frame axis is divided by the frame rate (seconds), and each axis by its base
(20, 2048, 2048) before the sine tables: what diffusers' ``LTXPipeline`` computes through
``rope_interpolation_scale = (8 / frame_rate, 32, 32)`` and ComfyUI 0.3.64's ``LTXVModel`` through its pixel
coordinates. 0.9.5+ files whose metadata asks for causal time positions (``keys.config_from_metadata``) count the
first latent frame as ONE video frame (the causal VAE encodes it alone): latent frame f sits at video frame
max(8 f - 7, 0) instead of 8 f, as diffusers' ``LTXConditionPipeline`` scales its video coordinates and ComfyUI's
Load Checkpoint runs such a file. The frame rate rides on the conditioning (``conditioning.LTXFrameRate``,
ComfyUI's ``LTXVConditioning``); 25 fps by default.

Image-to-video (ComfyUI's ``LTXVImgToVideo``: the start image's latent in the first frame, a LATENT noise mask
of 1 - strength there): as ComfyUI's ``model_base.LTXV`` samples with a noise mask, each token's timestep is the
step's times its denoise mask (``process_timestep``), so the time modulation is per token and split over "sp" with
the tokens (a stride-0 view of one row per video when the timestep is the same everywhere: no copy), and the kept
frame is blended back clean, not re-noised (``inpaint_with_clean_latent``: ComfyUI's ``scale_latent_inpaint``).

Model sampling: ComfyUI's ``supported_models.LTXV`` is ``ModelType.FLUX`` with shift 2.37 (``ModelSamplingFlux``:
sigma = e^2.37 / (e^2.37 + 1/t - 1)), whose timestep is sigma; the model embeds it x 1000 (ComfyUI's ``LTXVModel``
and diffusers' ``LTXPipeline``, which passes sigma x 1000). ``ModelSamplingLTXV`` / ``LTXVScheduler`` replace it
from a graph.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import flux_sampling
from . import CAUSAL_POSITIONS, ID
from .conditioning import frame_rates
from .latent import LTXV

ATTN_PROCESSOR = "LTXVideoAttnProcessor"  # calls dispatch_attention_fn: SDPA on diffusers' native backend
SHIFT = 2.37  # ComfyUI 0.3.64 supported_models.LTXV sampling_settings (ModelType.FLUX)
VAE_FACTORS = (8, 32, 32)  # video frames / pixels per latent frame / pixel (the released VAE; ComfyUI's too)
TIMESTEP_SCALE = 1000.0  # ComfyUI's LTXVModel embeds timestep x 1000; diffusers' pipeline passes sigma x 1000
MASK_BIAS = -10000.0  # what diffusers' transformer adds to the scores of padded text tokens
TOKEN_FIELDS = ("img", "img_rope", "temb", "temb_out")  # one entry per video token (temb: a view when uniform)


class LTXVideoAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        if config.patch_size != 1 or config.patch_size_t != 1:
            raise ConfigError(
                f"LTX-Video transformer with patch size {config.patch_size_t}x{config.patch_size}x{config.patch_size}",
                "every published LTX-Video 0.9 model takes one latent pixel per token; the token bands assume it",
                "load an LTX-Video 0.9 transformer as published",
            )
        channels = config.out_channels or config.in_channels
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks",),
            patch_size=1,
            patch_layout="pqc",
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="cross",
            guidance_embed=False,
            timestep="sigma",  # the model sampling's timestep (ModelSamplingFlux: sigma); embedded x 1000
            latent_format=latent_format or LTXV,
            model_sampling=flux_sampling(SHIFT),
            pads_to_patch=False,
            splits=(Split("img", 1), Split("img_rope", 1), Split("temb", 1), Split("temb_out", 1)),
            image_fields=TOKEN_FIELDS,
            inpaint_with_clean_latent=True,  # ComfyUI LTXV.scale_latent_inpaint: the kept latent, unnoised
            vae_scale_factor=VAE_FACTORS[1],
            latent_dims=3,
            vae_temporal_factor=VAE_FACTORS[0],
        )

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "last"  # attn1 is self-attention over the video tokens only

    def process_timestep(self, timestep: torch.Tensor, denoise_mask: torch.Tensor | None) -> torch.Tensor:
        """[B, tokens]: each token's timestep, the step's times its denoise mask (ComfyUI
        ``LTXV.process_timestep``); [B] without a mask."""
        if denoise_mask is None:
            return timestep
        return (denoise_mask[:, 0].flatten(1) * timestep.reshape(-1, 1)).to(timestep.dtype)

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        batch = x.shape[0]
        frames, rows, cols = self.grid_of(x)
        img = t.proj_in(x.flatten(2).transpose(1, 2))
        tokens = img.shape[1]
        if timestep.ndim > 1 and timestep.shape[-1] != tokens:
            raise ConfigError(
                f"LTX-Video timesteps for {timestep.shape[-1]} tokens given to a latent of {tokens}",
                "a noise mask gives one timestep per latent pixel of the video it belongs to",
                "make the LATENT and its noise mask with the same node (LTXVImgToVideo)",
            )
        temb, embedded = t.time_embed(timestep.flatten() * TIMESTEP_SCALE, batch_size=batch, hidden_dtype=img.dtype)
        txt = t.caption_projection(cond.prompt_embeds).view(batch, -1, img.shape[-1])
        mask = None
        if cond.attention_mask is not None:
            mask = ((1 - cond.attention_mask.to(img.dtype)) * MASK_BIAS).unsqueeze(1)
        causal = bool(t.config.get(CAUSAL_POSITIONS, False))
        rope = rotary(t.rope, (frames, rows, cols), frame_rates(cond, batch, x.device), causal)
        return Activations(
            img=img,
            txt=txt,
            temb=temb.view(batch, -1, temb.shape[-1]).expand(-1, tokens, -1),
            temb_out=embedded.view(batch, -1, embedded.shape[-1]).expand(-1, tokens, -1),
            grid=(frames, rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=rope,
            txt_mask=mask,
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        img = block(acts.img, acts.txt, _rows(acts.temb), acts.img_rope, acts.txt_mask)
        return acts.replace(img=img)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn1]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        shift, scale = (t.scale_shift_table[None, None] + _rows(acts.temb_out)[:, :, None]).unbind(dim=2)
        return t.proj_out(t.norm_out(acts.img) * (1 + scale) + shift)


def _rows(temb: torch.Tensor) -> torch.Tensor:
    """``temb`` [B, tokens, D] as one row per video when it is a view of one (the same timestep everywhere), so
    the blocks broadcast it instead of building a per-token copy; else as is."""
    return temb[:, :1] if temb.stride(1) == 0 else temb


def rotary(
    rope: nn.Module, grid: tuple[int, int, int], frame_rate: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [B, tokens, inner dim] of every token of the (frames, rows, cols) grid, for each video's frame
    rate: the positions in seconds and pixels over the rope's bases, ``rope.dim // 6`` log-spaced frequencies
    per axis from 1 to theta (times pi/2, on positions mapped to -1..1), each used for a pair of channels; the
    channels left over (``dim % 6``) rotate by nothing. ``causal``: the video frame of latent frame f is
    max(8 f - 7, 0) (the first latent frame holds one video frame), else 8 f."""
    frames, rows, cols = grid
    device = frame_rate.device
    axes = [torch.arange(n, dtype=torch.float32, device=device) for n in grid]
    f, h, w = torch.meshgrid(*axes, indexing="ij")
    spatial = VAE_FACTORS[1] * rope.patch_size
    if causal:
        video_frame = (f.reshape(1, -1) * (VAE_FACTORS[0] * rope.patch_size_t) + 1 - VAE_FACTORS[0]).clamp(min=0)
        time = video_frame / rope.base_num_frames / frame_rate[:, None]
    else:
        time = f.reshape(1, -1) * (VAE_FACTORS[0] * rope.patch_size_t / rope.base_num_frames) / frame_rate[:, None]
    per_axis = [
        time,
        (h.reshape(1, -1) * (spatial / rope.base_height)).expand(frame_rate.shape[0], -1),
        (w.reshape(1, -1) * (spatial / rope.base_width)).expand(frame_rate.shape[0], -1),
    ]
    pos = torch.stack(per_axis, dim=-1)  # [B, tokens, 3] in 0..1
    count = rope.dim // 6
    freqs = rope.theta ** torch.linspace(0.0, 1.0, count, device=device, dtype=torch.float32) * (math.pi / 2)
    angles = (freqs * (pos.unsqueeze(-1) * 2 - 1)).transpose(-1, -2).flatten(2)  # [B, tokens, 3 * count]
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    rest = rope.dim % 6
    if rest:
        cos = torch.cat([cos.new_ones(*cos.shape[:2], rest), cos], dim=-1)
        sin = torch.cat([sin.new_zeros(*sin.shape[:2], rest), sin], dim=-1)
    return cos, sin  # float32, as diffusers keeps them (the processor rotates in float32)
