"""HunyuanVideo 1.5 (HunyuanVideo15Transformer3DModel): one token per latent pixel of a frame (patch 1, VAE 16x),
54 double-stream blocks with joint [video, text] attention, 3-axis RoPE on the video tokens.

The text joining the attention is built as the transformer builds it for text-to-video: the glyph text's ByT5
states projected (``context_embedder_2``) and the prompt's Qwen2.5-VL states through the token refiner, each with
its type embedding (``cond_type_embed``), kept tokens only (the vision tokens are all masked out without a start
image, so they are left out). The video input carries the image-to-video channels as zeros (a zero condition
latent and mask: diffusers' text-to-video).

Image-to-video (``GlyphText.start_latent`` + ``image_embeds``, as HunyuanVideo15ImageToVideoPipeline builds them):
the condition channels hold the start image's latent (model space) on the first latent frame and zeros after,
the mask channel 1 on the first frame; the SigLIP states, projected (``image_embedder``) with their type
embedding, join the text first, all kept: [image, glyph, prompt]. Tokens, RoPE rows and text are split over "sp" as for HunyuanVideo 1.0;
the same text rules hold (see ``hunyuan_video.adapter``): padding cut, prompts of different lengths masked on one
rank only, every sequence-parallel rank needs a text token.

Model sampling: discrete flow, shift 7 (ComfyUI 0.3.64 lacks the family; a later ComfyUI's ``HunyuanVideo15``
states this shift).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import discrete_flow_sampling
from ..hunyuan_video.adapter import check_text_split, kept_text
from . import ID
from .conditioning import glyph_text, start_image_channels
from .latent import HUNYUAN_VIDEO15

ATTN_PROCESSOR = "HunyuanVideo15AttnProcessor2_0"
SHIFT = 7.0
MLLM, BYT5, IMAGE = 0, 1, 2  # cond_type_embed rows of the three text sources


class HunyuanVideo15Adapter(ModelAdapter):
    family = ID
    sdpa_processors = (ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        if config.patch_size_t != 1 or config.use_meanflow:
            raise ConfigError(
                f"HunyuanVideo 1.5 transformer with temporal patch {config.patch_size_t}, meanflow {config.use_meanflow}",
                "the published text-to-video models patch one frame per token and take one timestep",
                "load a HunyuanVideo 1.5 text-to-video transformer (480p / 720p t2v)",
            )
        channels = config.out_channels
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks",),
            patch_size=config.patch_size,
            patch_layout="cpq",
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=False,
            timestep="sigma_x1000",
            latent_format=latent_format or HUNYUAN_VIDEO15,
            model_sampling=discrete_flow_sampling(SHIFT),
            pads_to_patch=False,
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_mask", 1)),
            vae_scale_factor=16,
            latent_dims=3,
            vae_temporal_factor=4,
        )

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "last"

    def embed(self, x, timestep, cond, mesh, guidance=None) -> Activations:
        check_text_split(_joint_text(cond)[0], _joint_text(cond)[1], mesh.size("sp"), "sequence parallelism")
        return super().embed(x, timestep, cond, mesh, guidance)

    def embed_rows(self, x_band, rows, full_size, timestep, cond, mesh, guidance=None) -> Activations:
        text, keep = _joint_text(cond)
        check_text_split(text, keep, mesh.size("sp"), "PipeFusion", masks_allowed=False)
        return super().embed_rows(x_band, rows, full_size, timestep, cond, mesh, guidance)

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        glyph = glyph_text(cond)
        x = start_image_channels(x, glyph, t.config.in_channels, self.plan.latent_format)
        frames, rows, cols = self.grid_of(x)
        temb = t.time_embed(timestep)
        mllm, mllm_keep = kept_text(cond.prompt_embeds, cond.attention_mask)
        mllm = t.context_embedder(mllm, timestep, mllm_keep)
        mllm = mllm + t.cond_type_embed.weight[MLLM].to(mllm.dtype)
        parts, keeps = [mllm], [mllm_keep]
        if glyph.byt5 is not None and glyph.byt5.shape[1]:
            byt5, byt5_keep = kept_text(glyph.byt5, glyph.byt5_mask)
            byt5 = t.context_embedder_2(byt5) + t.cond_type_embed.weight[BYT5].to(mllm.dtype)
            parts, keeps = [byt5, mllm], [byt5_keep, mllm_keep]  # the transformer's order: glyph, then prompt
        if glyph.image_embeds is not None:  # image-to-video: the SigLIP tokens first, all kept
            image = t.image_embedder(glyph.image_embeds.to(mllm.dtype)) + t.cond_type_embed.weight[IMAGE].to(mllm.dtype)
            parts, keeps = [image, *parts], [None, *keeps]
        txt = torch.cat(parts, dim=1)
        keep = None
        if any(k is not None for k in keeps):
            keep = torch.cat([p.new_ones(p.shape[:2]) if k is None else k for p, k in zip(parts, keeps)], dim=1)
        return Activations(
            img=t.x_embedder(x),
            txt=txt,
            temb=temb,
            temb_out=temb,
            grid=(frames, rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=t.rope(x),
            txt_mask=keep,
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        # the processor always builds a text key mask: all kept unless prompts of different lengths are batched
        mask = acts.txt_mask if acts.txt_mask is not None else acts.txt.new_ones(acts.txt.shape[:2])
        img, txt = block(acts.img, acts.txt, acts.temb, mask, acts.img_rope)
        return acts.replace(img=img, txt=txt)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))


def _joint_text(cond: Conditioning) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The joint text's tokens (glyph + prompt, kept) as the split checks see them: a [B, T, 1] stand-in and keep."""
    mllm, mllm_keep = kept_text(cond.prompt_embeds, cond.attention_mask)
    glyph = glyph_text(cond)
    tokens, keeps = [mllm[..., :1]], [mllm_keep]
    if glyph.byt5 is not None and glyph.byt5.shape[1]:
        byt5, byt5_keep = kept_text(glyph.byt5, glyph.byt5_mask)
        tokens, keeps = [byt5[..., :1].to(mllm.dtype), tokens[0]], [byt5_keep, mllm_keep]
    if glyph.image_embeds is not None:
        tokens, keeps = [glyph.image_embeds[..., :1].to(mllm.dtype), *tokens], [None, *keeps]
    keep = None
    if any(k is not None for k in keeps):
        keep = torch.cat([t.new_ones(t.shape[:2]) if k is None else k.to(t.dtype) for t, k in zip(tokens, keeps)], 1)
    return torch.cat(tokens, dim=1), keep
