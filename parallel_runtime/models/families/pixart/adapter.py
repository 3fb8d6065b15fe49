"""PixArt-alpha / sigma (PixArtTransformer2DModel): self-attention on image tokens, cross-attention
to the text, adaLN-single timestep (+ resolution/aspect conditions for alpha 1024), learned sigma.

Only the image tokens are split over sp. The projected text and its mask stay replicated: they
are the K/V of cross-attention (``attn2``), which runs outside the sequence-parallel intercept.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ... import compat
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import discrete_eps_sampling
from . import ID
from .latent import latent_format as pixart_latent_format


class PixArtAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        channels = config.in_channels
        out = config.out_channels or channels
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks",),
            patch_size=config.patch_size,
            patch_layout="pqc",
            latent_channels=channels,
            out_channels=out,
            learned_sigma=out == 2 * channels,
            text_attention="cross",
            guidance_embed=False,
            timestep="discrete",
            latent_format=latent_format or pixart_latent_format(channels, bool(config.use_additional_conditions)),
            splits=(Split("img", 1),),
            model_sampling=discrete_eps_sampling("sqrt_linear", 0.0001, 0.02, 1000),  # ComfyUI's PixArtAlpha/Sigma
            pads_to_patch=False,  # ComfyUI's PixArt builds its position embedding for whole patches only
        )

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        batch = x.shape[0]
        grid = self.grid_of(x)
        img = t.pos_embed(x)  # patchify + sin-cos position embedding
        added = {"resolution": None, "aspect_ratio": None}
        if t.use_additional_conditions:
            height, width = (s * self.plan.vae_scale_factor for s in x.shape[-2:])
            added["resolution"] = torch.tensor([[height, width]], dtype=img.dtype, device=x.device).repeat(batch, 1)
            added["aspect_ratio"] = torch.tensor([[height / width]], dtype=img.dtype, device=x.device).repeat(batch, 1)
        temb, embedded = t.adaln_single(timestep, added, batch_size=batch, hidden_dtype=img.dtype)
        txt = cond.prompt_embeds
        if t.caption_projection is not None:
            txt = t.caption_projection(txt).view(batch, -1, img.shape[-1])
        mask = None
        if cond.attention_mask is not None:  # 1 = keep -> additive bias, as the diffusers model does
            mask = ((1 - cond.attention_mask.to(img.dtype)) * -10000.0).unsqueeze(1)
        return Activations(
            img=img, txt=txt, temb=temb, temb_out=embedded, grid=grid, txt_tokens=txt.shape[1], txt_mask=mask
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        img = block(
            acts.img,
            attention_mask=None,
            encoder_hidden_states=acts.txt,
            encoder_attention_mask=acts.txt_mask,
            timestep=acts.temb,
        )
        return acts.replace(img=img)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn1]  # attn2 is cross-attention to the replicated text: never intercepted

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        table = t.scale_shift_table
        shift, scale = (table[None] + acts.temb_out[:, None].to(table.device)).chunk(2, dim=1)
        return t.proj_out(t.norm_out(acts.img) * (1 + scale) + shift)
