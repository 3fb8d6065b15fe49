"""Wan 2.1 / 2.2 (WanTransformer3DModel): video tokens, 3-axis RoPE, cross-attention to UMT5 text.

A latent [B, C, T, H, W] becomes one token per frame and 2x2 pixels (diffusers' ``patch_embedding``),
row-major over (T, H/2, W/2); the image tokens and their RoPE rows are split over "sp", the projected text
(and Wan 2.1 I2V's CLIP-vision tokens in front of it) stays replicated: it is the K/V of the
cross-attention ``attn2``, which runs outside the sequence-parallel intercept.

Variants, as ComfyUI tells them apart (``comfy.model_detection`` / ``model_base.WAN21`` / ``WAN22``):
- text-to-video (in = out = 16 channels): Wan 2.1 1.3B / 14B, Wan 2.2 A14B high- and low-noise experts;
- image-to-video (36 = 16 + 4 mask + 16 image-latent channels): Wan 2.1 I2V 14B (with CLIP-vision
  ``image_embeds``) and Wan 2.2 I2V A14B (without); Fun-Control (Wan 2.1: 48 = 16 + 16 control + 16 image,
  Wan 2.2: 52 with 4 mask channels between them). The extra channels are built (``concat``) from the
  conditioning's ``concat_latent_image`` / ``concat_mask`` / ``concat_mask_index`` as ComfyUI's
  ``WAN21.concat_cond`` builds them from ``WanImageToVideo`` / ``WanFunControlToVideo``'s; a Fun-Control file
  with a ``ref_conv`` also reads ``Wan22FunControlToVideo``'s reference image as one extra frame of tokens
  (``reference``), carried after the video's as ``ref_tokens``;
- Wan 2.2 TI2V-5B (48 channels, 16x VAE): timesteps may differ per frame (``Wan22ImageToVideoLatent`` keeps
  the first frame): the time embedding is computed per frame and expanded to a per-token modulation, which
  is split over "sp" with the tokens (diffusers' 4-D ``temb`` path).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import discrete_flow_sampling
from . import ID
from .concat import concat_channels, cuts_image
from .conditioning import image_inputs
from .latent import WAN21, WAN22
from .reference import reference_tokens, rope_after_reference
from .vace import context_tokens, hint_blocks, run_hints

WAN_SHIFT = 8.0  # ComfyUI 0.3.64 WAN21_T2V sampling_settings, inherited by WAN21_I2V and WAN22_T2V (TI2V-5B)

REFERENCE_VACE = (
    "a reference image (reference_latents) together with WanVaceToVideo's control video",
    "no published Wan file has both a reference-image embedding and VACE blocks",
    "leave one of them out",
)
TEXT_TOKENS_WITH_IMAGE = 512  # diffusers' WanAttnProcessor takes the last 512 context tokens as the text


class WanAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.WAN_ATTN_PROCESSOR,)

    def __init__(self, transformer: nn.Module, latent_format: LatentFormat | None = None):
        self._hints = hint_blocks(transformer)  # VACE: id(main block) -> the hint block after it
        super().__init__(transformer, latent_format)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        pt, ph, pw = config.patch_size
        if pt != 1 or ph != pw:
            raise ConfigError(
                f"Wan transformer with patch size {tuple(config.patch_size)}",
                "every published Wan model patches 1 frame x 2x2 pixels; the token bands assume one frame per token",
                "load a Wan 2.1 / 2.2 transformer",
            )
        channels = config.out_channels or config.in_channels
        per_frame_time = channels == WAN22.channels  # TI2V-5B (ComfyUI's WAN22)
        token_fields = ("img", "img_rope", "control", *(("temb", "temb_out") if per_frame_time else ()))
        splits = [Split("img", 1), Split("img_rope", 1), Split("control", 1)]  # control: VACE's streams
        if per_frame_time:
            splits += [Split("temb", 1), Split("temb_out", 1)]
        return ModelPlan(
            family=cls.family,
            block_lists=("blocks",),
            patch_size=ph,
            patch_layout="pqc",
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="cross",
            guidance_embed=False,
            timestep="sigma_x1000",
            latent_format=latent_format or (WAN22 if per_frame_time else WAN21),
            # every Wan variant (2.1 T2V/I2V, 2.2 A14B, TI2V-5B): ModelType.FLOW -> ModelSamplingDiscreteFlow
            model_sampling=discrete_flow_sampling(WAN_SHIFT),
            # ComfyUI's WanModel pads the input (latent and image-to-video channels) circularly and crops back
            pads_to_patch=True,
            splits=tuple(splits),
            vae_scale_factor=16 if per_frame_time else 8,
            latent_dims=3,
            vae_temporal_factor=4,
            image_fields=token_fields,
            inpaint_with_clean_latent=per_frame_time,  # ComfyUI WAN22.scale_latent_inpaint
        )

    @property
    def per_frame_time(self) -> bool:
        return self.plan.latent_channels == WAN22.channels

    # -- inputs ------------------------------------------------------------------------------------
    def condition_channels(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """The latent with the image-to-video / Fun-Control input channels after it (``concat``; ComfyUI
        ``WAN21.concat_cond``); ``x`` may be padded to whole tokens (``pad_to_patch``)."""
        config = self.transformer.config
        cuts = cuts_image(config.in_channels, config.image_dim, self.per_frame_time)
        fmt = self.plan.latent_format
        return concat_channels(x, image_inputs(cond), config.in_channels, fmt, cuts, self.pad_to_patch)

    def process_timestep(self, timestep: torch.Tensor, denoise_mask: torch.Tensor | None) -> torch.Tensor:
        """TI2V: one timestep per frame, scaled by the frame's mean denoise mask (ComfyUI
        ``WAN22.process_timestep``); [B] otherwise."""
        if not self.per_frame_time or denoise_mask is None:
            return timestep
        return denoise_mask.mean(dim=(1, 3, 4)) * timestep.reshape(-1, 1)

    # -- phases ------------------------------------------------------------------------------------
    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        x = self.condition_channels(x, cond)
        frames, rows, cols = self.grid_of(x)
        img = t.patch_embedding(x).flatten(2).transpose(1, 2).contiguous()
        per_frame = timestep.reshape(x.shape[0], -1)  # [B, 1] or [B, frames]
        if per_frame.shape[1] not in (1, frames):
            raise ConfigError(
                f"{per_frame.shape[1]} timesteps for a latent of {frames} frames",
                "Wan takes one timestep per sample, or (TI2V) one per latent frame",
                "pass a [batch] or [batch, frames] timestep",
            )
        image_states = image_inputs(cond).image_embeds
        if image_states is not None and cond.prompt_embeds.shape[1] != TEXT_TOKENS_WITH_IMAGE:
            raise ConfigError(
                f"{cond.prompt_embeds.shape[1]} text tokens with a CLIP-vision image embedding (Wan 2.1 I2V)",
                f"diffusers' Wan attention takes the last {TEXT_TOKENS_WITH_IMAGE} context tokens as the text "
                "and the rest as the image; other lengths would be split in the wrong place",
                "encode the prompt to 512 tokens (ComfyUI's Wan text encoder and Parallel Text Encode do this "
                "for prompts up to 512 tokens): shorten the prompt",
            )
        temb, proj, txt, img_txt = t.condition_embedder(
            per_frame.flatten(), cond.prompt_embeds, image_states, timestep_seq_len=per_frame.shape[1]
        )
        if img_txt is not None:
            txt = torch.cat([img_txt, txt], dim=1)
        proj = proj.unflatten(2, (6, -1))  # [B, 1 or frames, 6, D]
        if self.per_frame_time:  # per token: [B, S, 6, D] and [B, S, D] (a view when every frame agrees)
            per_token = rows * cols
            proj, temb = (_per_token(v, frames, per_token) for v in (proj, temb))
        else:
            proj, temb = proj[:, 0], temb[:, 0]  # [B, 6, D] and [B, D]
        control, scale = None, ()
        if self._hints:  # VACE: the patch-embedded latent and each entry's context, split with the video tokens
            streams, scale = context_tokens(t.vace_patch_embedding, x, image_inputs(cond), self.plan.latent_format,
                                            self.pad_to_patch)  # fmt: skip
            control = (img, *streams)
        img_rope, refs = t.rope(x), 0
        reference = image_inputs(cond).reference
        if reference is not None:  # Fun-Control's reference frame: after the video's tokens, at frame 0
            if control is not None:
                raise ConfigError(*REFERENCE_VACE)
            ref, ref_rope, img_rope = reference_tokens(t, reference, x, self.plan.latent_format, self.per_frame_time)
            img, refs = torch.cat([img, ref], dim=1), ref.shape[1]
            img_rope = tuple(torch.cat(pair, dim=1) for pair in zip(img_rope, ref_rope, strict=True))
        elif image_inputs(cond).reference_kept:  # PipeFusion: the reference's K/V are kept; positions as with it
            img_rope = rope_after_reference(t, x)[1]
        return Activations(
            img=img,
            control=control,
            control_scale=scale,
            txt=txt,
            temb=proj,
            temb_out=temb,
            grid=(frames, rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=img_rope,
            ref_tokens=refs,
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        img = block(acts.img, acts.txt, acts.temb, acts.img_rope)
        hint = self._hints.get(id(block))
        if hint is None or acts.control is None:
            return acts.replace(img=img)
        img, control = run_hints(hint, img, acts)
        return acts.replace(img=img, control=control)

    def spent_fields(self, stop: int) -> tuple[str, ...]:
        """PipeFusion: the Activations fields no block from ``stop`` on reads. VACE's first control stream (the
        patch-embedded latent) is read only by the first hint block (the one with ``proj_in``)."""
        layers = self.transformer.config.vace_layers if self._hints else None
        return ("control.0",) if layers and layers[0] < stop else ()

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        hint = self._hints.get(id(block))  # a VACE hint block's self-attention runs with its main block's
        # attn2 is cross-attention to the replicated text: never intercepted
        return [block.attn1] if hint is None else [block.attn1, hint.attn1]

    def companion_prefixes(self) -> dict[int, tuple[str, ...]]:
        """VACE: hint block ``n`` runs in the call of main block ``vace_layers[n]`` (a PipeFusion stage loads
        it with that block)."""
        if not self._hints:
            return {}
        return {i: (f"vace_blocks.{n}.",) for n, i in enumerate(self.transformer.config.vace_layers)}

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        table, temb = t.scale_shift_table, acts.temb_out
        if temb.ndim == 3:  # per token
            shift, scale = (table.unsqueeze(0) + temb.unsqueeze(2)).chunk(2, dim=2)
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:
            shift, scale = (table + temb.unsqueeze(1)).chunk(2, dim=1)
        hidden = t.norm_out(acts.img.float()) * (1 + scale) + shift
        return t.proj_out(hidden.type_as(acts.img))


def _per_token(value: torch.Tensor, frames: int, per_frame_tokens: int) -> torch.Tensor:
    """[B, 1 or frames, ...] per frame -> [B, frames * per_frame_tokens, ...] per token."""
    if value.shape[1] == 1:
        return value.expand(value.shape[0], frames * per_frame_tokens, *value.shape[2:])
    return value.repeat_interleave(per_frame_tokens, dim=1)
