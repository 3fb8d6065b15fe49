"""SD3 / SD3.5 (SD3Transformer2DModel): joint attention, patch embed with cropped sin-cos positions.

The image tokens come from ``pos_embed`` (2x2 patch conv + position embedding) on the whole latent,
then each sp rank keeps its share of image and text tokens. SD3.5's dual-attention blocks add an
image-only self-attention (``attn2``), also sequence-parallel. The last block consumes the text.
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
from .latent import latent_format as sd3_latent_format


class SD3Adapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.JOINT_ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        channels = config.in_channels
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks",),
            patch_size=config.patch_size,
            patch_layout="pqc",
            latent_channels=channels,
            out_channels=config.out_channels or channels,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=False,
            timestep="sigma_x1000",
            latent_format=latent_format or sd3_latent_format(channels),
            splits=(Split("img", 1), Split("txt", 1)),
            model_sampling=discrete_flow_sampling(3.0, 1000.0),  # ComfyUI's SD3 (and SD3.5) sampling_settings
            max_grid_side=config.pos_embed_max_size,  # the position table is cropped, never extended
        )

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        if cond.pooled is None:
            raise ConfigError(
                "SD3 conditioning has no pooled text embedding",
                "SD3's time embedding adds the pooled CLIP-L + CLIP-G outputs",
                "encode the prompt with the SD3 text encoders (pooled = CLIP-L and CLIP-G projections)",
            )
        grid = self.grid_of(x)
        img = t.pos_embed(x).contiguous()  # patchify + cropped position embedding
        temb = t.time_text_embed(timestep, cond.pooled)
        txt = t.context_embedder(cond.prompt_embeds)
        return Activations(img=img, txt=txt, temb=temb, temb_out=temb, grid=grid, txt_tokens=txt.shape[1])

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        txt, img = block(hidden_states=acts.img, encoder_hidden_states=acts.txt, temb=acts.temb)
        return acts.replace(img=img, txt=txt)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn] if block.attn2 is None else [block.attn, block.attn2]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))
