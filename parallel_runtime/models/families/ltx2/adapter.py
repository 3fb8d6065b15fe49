"""LTX-2 (LTX2VideoTransformer3DModel), video-only: video tokens, 3-axis rotary positions, cross-attention to text.

The released transformer is an audio-video model: every block runs a video stream and an audio stream, each with
self-attention, cross-attention to its own text and a feed-forward, plus audio->video and video->audio
cross-attentions between the two streams. The streams touch only through those two cross-attentions, and diffusers'
forward can switch them off (``isolate_modalities=True``, the modality-isolated pass LTX2Pipeline runs for its
modality guidance): the video stream then depends on nothing of the audio. That is what runs here: the video
stream alone, audio absent, every audio request refused (``audio.py``). A joint audio-video generation needs the
audio latent sampled alongside the video's, which the engine's samplers do not carry (README, LTX-2).

A latent [B, 128, T, H, W] becomes one token per latent pixel (``proj_in`` on the channels), row-major over
(T, H, W). Tokens and their rotary (cos, sin) rows are split over "sp"; the projected text stays replicated (the
K/V of ``attn2``, outside the sequence-parallel intercept). The rotary positions are diffusers' own
(``rope.prepare_video_coords`` + ``rope``): each token's [start, end) box in pixels (VAE factors 8 frames, 32 px;
the first latent frame causal: one video frame), its midpoint (fractional), the time axis in seconds (divided by
the frame rate, ``conditioning.LTX2FrameRate``), each axis over its base (20 s, 2048 px). The rows are per token,
so the attention intercept's sequence split cuts them with the tokens; the processor rotates Q/K on the local
tokens before SDPA. "split" rotary tables ([B, heads, tokens, r]) are kept token-major ([B, tokens, heads, r]) so
that one split dim serves both rotary types.

Model sampling: ComfyUI 0.3.64 has no LTX-2. The release's diffusers scheduler (FlowMatchEulerDiscreteScheduler,
``configs/*/scheduler_config.json``) shifts exponentially by mu, linear in the token count from 0.95 at 1024
tokens to 2.05 at 4096 (LTX2Pipeline's ``calculate_shift``): ComfyUI's ModelSamplingFlux with shift = mu is that
shift; the default is mu at the release's usual 768x512, 121 frames (6144 tokens: 2.783). The model embeds
sigma x 1000 (the pipeline passes the scheduler's timestep).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import flux_sampling
from . import ID
from .conditioning import frame_rates
from .latent import LTX2_VIDEO

ATTN_PROCESSOR = "LTX2AudioVideoAttnProcessor"  # calls dispatch_attention_fn: SDPA on diffusers' native backend
VAE_FACTORS = (8, 32, 32)  # video frames / pixels per latent frame / pixel (the released VAE)
TIMESTEP_SCALE = 1000.0  # LTX2Pipeline passes the scheduler's timestep, sigma x 1000
MASK_BIAS = -10000.0  # what diffusers' transformer adds to the scores of padded text tokens
# the release's scheduler_config.json: mu from base_shift at base_image_seq_len to max_shift at max_image_seq_len
SHIFT_TOKENS, SHIFTS = (1024, 4096), (0.95, 2.05)
DEFAULT_TOKENS = 16 * 16 * 24  # 121 frames at 768x512: 16 latent frames of 16 x 24


def dynamic_shift(tokens: int) -> float:
    """mu of the release's scheduler for a video of ``tokens`` latent pixels (LTX2Pipeline's calculate_shift)."""
    (n0, n1), (s0, s1) = SHIFT_TOKENS, SHIFTS
    return s0 + (s1 - s0) / (n1 - n0) * (tokens - n0)


class LTX2Adapter(ModelAdapter):
    family = ID
    sdpa_processors = (ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        _check_supported(config)
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
            latent_format=latent_format or LTX2_VIDEO,
            model_sampling=flux_sampling(
                round(dynamic_shift(DEFAULT_TOKENS), 4), "LTX-2's scheduler config at 768x512, 121 frames"
            ),
            pads_to_patch=False,
            splits=(Split("img", 1), Split("img_rope", 1)),
            vae_scale_factor=VAE_FACTORS[1],
            latent_dims=3,
            vae_temporal_factor=VAE_FACTORS[0],
        )

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "last"  # attn1 is self-attention over the video tokens only

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        batch = x.shape[0]
        frames, rows, cols = self.grid_of(x)
        img = t.proj_in(x.flatten(2).transpose(1, 2))
        temb, embedded = t.time_embed(timestep.flatten() * TIMESTEP_SCALE, batch_size=batch, hidden_dtype=img.dtype)
        txt = t.caption_projection(cond.prompt_embeds).view(batch, -1, img.shape[-1])
        mask = None
        if cond.attention_mask is not None:
            mask = ((1 - cond.attention_mask.to(img.dtype)) * MASK_BIAS).unsqueeze(1)
        return Activations(
            img=img,
            txt=txt,
            temb=temb.view(batch, -1, temb.shape[-1]),
            temb_out=embedded.view(batch, -1, embedded.shape[-1]),
            grid=(frames, rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=rotary(t.rope, (frames, rows, cols), frame_rates(cond, batch, x.device)),
            txt_mask=mask,
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        """The block's video stream (diffusers' ``LTX2VideoTransformerBlock.forward`` with the audio<->video
        cross-attentions off): self-attention, text cross-attention, feed-forward, each modulated by time."""
        h = acts.img
        mods = block.scale_shift_table[None, None] + acts.temb.unflatten(-1, (block.scale_shift_table.shape[0], -1))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mods.unbind(dim=2)
        rope = acts.img_rope
        if block.attn1.rope_type == "split":
            rope = tuple(r.transpose(1, 2) for r in rope)  # stored token-major: the processor wants heads first
        normed = block.norm1(h) * (1 + scale_msa) + shift_msa
        h = h + block.attn1(normed, None, None, rope) * gate_msa
        h = h + block.attn2(block.norm2(h), acts.txt, acts.txt_mask)
        h = h + block.ff(block.norm3(h) * (1 + scale_mlp) + shift_mlp) * gate_mlp
        return acts.replace(img=h)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn1]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        shift, scale = (t.scale_shift_table[None, None] + acts.temb_out[:, :, None]).unbind(dim=2)
        return t.proj_out(t.norm_out(acts.img) * (1 + scale) + shift)


def _check_supported(config: Any) -> None:
    """LTX-2.0's transformer as released; the LTX-2.3 additions this adapter does not run are refused."""
    if config.patch_size != 1 or config.patch_size_t != 1:
        raise ConfigError(
            f"LTX-2 transformer with patch size {config.patch_size_t}x{config.patch_size}x{config.patch_size}",
            "every published LTX-2 model takes one latent pixel per token; the token bands assume it",
            "load an LTX-2 transformer as published",
        )
    newer = [k for k in ("cross_attn_mod", "perturbed_attn", "use_keyframes_abs_pos_embedding") if config.get(k)]
    if newer or not config.get("use_prompt_embeddings", True):
        raise ConfigError(
            f"LTX-2 transformer with {', '.join(newer) or 'use_prompt_embeddings=False'}",
            "this adapter runs LTX-2.0's video stream; the prompt modulation, perturbed attention, keyframe "
            "embedding and connector-side projections of later LTX-2.x releases are not implemented",
            "load the LTX-2.0 transformer (ltx-2-19b-dev / distilled)",
        )


def rotary(rope: nn.Module, grid: tuple[int, int, int], frame_rate: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(cos, sin) of every token of the (frames, rows, cols) grid for each video's frame rate, by diffusers' own
    rope module: [B, tokens, dim] ("interleaved") or [B, tokens, heads, dim / heads / 2] ("split", token-major).
    The coordinates are made at 1 fps and their time axis divided by each video's rate (diffusers divides by
    one rate for the whole batch)."""
    coords = rope.prepare_video_coords(frame_rate.shape[0], *grid, frame_rate.device, fps=1.0)
    coords[:, 0] = coords[:, 0] / frame_rate[:, None, None]
    cos, sin = rope(coords, device=frame_rate.device)
    if rope.rope_type == "split":
        cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)
    return cos, sin  # float32 (the processor rotates in float32)
