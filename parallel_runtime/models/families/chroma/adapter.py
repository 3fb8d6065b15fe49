"""Chroma (ChromaTransformer2DModel): Flux's joint text+image attention and 3-axis rotary ids, with every
modulation (shift, scale, gate of each block, the output layer's shift and scale) a row of one table.

The table: the "approximator" (an MLP) maps, for every index i, [timestep features, guidance features,
features of i] to one modulation vector. Rows, in order: 3 per single block, 6 per double block (image),
6 per double block (text), 2 for the output layer (diffusers' ``ChromaTransformer2DModel.forward``;
ComfyUI's ``Chroma.get_modulations`` reads the same rows of a table it always builds 344 rows long,
which is exactly this table for the published 19 + 38 blocks). The table is computed once per call on
the whole batch and travels replicated (``temb``); each block reads its rows by its index.

Guidance: diffusers always feeds 0; ComfyUI feeds the conditioning's guidance (FluxGuidance), 0 when there
is none (``model_base.Chroma.extra_conds``). Both are honoured: the plan embeds guidance, default 0.

Layout: the latent [B,16,H,W] is packed into 2x2 patches (channel order c,p,q), text tokens come first in
every attention call; each sp rank holds [its text shard, its image shard] and the rotary rows of those
tokens. The single blocks take text and image as one sequence: each rank concatenates its own shards, so
the sequence attention sees is a permutation of the full one, which attention does not notice.

Text padding: Chroma's pipeline pads T5's output to 512 tokens and masks all but the first padding token.
Trailing tokens masked for the whole batch are dropped (exact: a masked key changes nothing and no kept
token moves); a mask that still masks something (prompts of different lengths in one batch) is applied
on one rank only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import flux_sampling
from ...text_padding import check_mask_layout, strip_text_padding
from ..flux.adapter import image_ids
from ..flux.latent import latent_format as flux_latent_format
from . import ID

PACK = 2  # 2x2 latent pixels per token
DOUBLE, SINGLE = "transformer_blocks", "single_transformer_blocks"


class ChromaAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.FLUX_ATTN_PROCESSOR,)

    def __init__(self, transformer: nn.Module, latent_format: LatentFormat | None = None):
        super().__init__(transformer, latent_format)
        self._index = {id(b): i for name in self.plan.block_lists for i, b in enumerate(getattr(transformer, name))}

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        out = config.out_channels or config.in_channels
        if config.patch_size != 1 or config.in_channels != out or out % (PACK * PACK):
            raise ConfigError(
                f"Chroma transformer with patch_size={config.patch_size}, in_channels={config.in_channels}, "
                f"out_channels={out}",
                "only text-to-image Chroma (packed 2x2 latents in, same channels out) is supported; Chroma "
                "Radiance works on pixels",
                "load a Chroma1 (HD / Base / Flash) transformer",
            )
        channels = out // (PACK * PACK)
        return ModelPlan(
            family=cls.family,
            block_lists=(DOUBLE, SINGLE),
            patch_size=PACK,
            patch_layout="cpq",
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=True,
            timestep="sigma",
            latent_format=latent_format or flux_latent_format(channels),  # ComfyUI: latent_formats.Flux
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_rope", 0)),
            # ComfyUI's supported_models.Chroma: ModelType.FLUX, no shift in sampling_settings -> ModelSamplingFlux 1.15
            model_sampling=flux_sampling(1.15),
            default_guidance=0.0,  # model_base.Chroma.extra_conds: guidance 0 for an entry without one
        )

    def modulations(self, timestep: torch.Tensor, guidance: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        """The modulation table [B, rows, width] at ``timestep`` (sigma) and ``guidance`` (0 when None)."""
        t = self.transformer
        embed = t.time_text_embed
        times = embed.time_proj(timestep.to(dtype) * 1000).to(dtype)
        scale = torch.zeros_like(timestep, dtype=torch.float32) if guidance is None else guidance.float() * 1000
        scales = embed.guidance_proj(scale).to(dtype)
        index = embed.mod_proj.to(device=times.device, dtype=dtype)  # features of every row index
        batch, rows = times.shape[0], index.shape[0]
        per_call = torch.cat([times, scales], dim=1)[:, None].expand(-1, rows, -1)
        return t.distilled_guidance_layer(torch.cat([per_call, index[None].expand(batch, -1, -1)], dim=-1))

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        text, mask = strip_text_padding(cond.prompt_embeds, cond.attention_mask)
        rows, cols = self.grid_of(x)
        img = t.x_embedder(self.patchify(x))
        table = self.modulations(timestep, guidance, img.dtype)
        txt = t.context_embedder(text)
        return Activations(
            img=img,
            txt=txt,
            temb=table,
            temb_out=table[:, -2:],
            grid=(rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=t.pos_embed(image_ids(rows, cols, x.device)),
            txt_rope=t.pos_embed(torch.zeros(txt.shape[1], 3, device=x.device)),
            txt_mask=mask,
        )

    def embed(self, x, timestep, cond, mesh, guidance=None) -> Activations:
        acts = super().embed(x, timestep, cond, mesh, guidance)
        _check_mask_layout(acts, mesh)
        return acts

    def embed_rows(self, x_band, rows, full_size, timestep, cond, mesh, guidance=None) -> Activations:
        acts = super().embed_rows(x_band, rows, full_size, timestep, cond, mesh, guidance)
        _check_mask_layout(acts, mesh)
        return acts

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        i, table = self._index[id(block)], acts.temb
        rope = tuple(torch.cat([a, b]) for a, b in zip(acts.txt_rope, acts.img_rope))
        mask = None
        if acts.txt_mask is not None:  # one rank only (_check_mask_layout): [text, image] keys, 1 = attend
            mask = torch.cat([acts.txt_mask.bool(), acts.txt_mask.new_ones(acts.img.shape[:2], dtype=torch.bool)], 1)
        singles, doubles = len(self.transformer.single_transformer_blocks), len(self.transformer.transformer_blocks)
        if list_name == DOUBLE:
            img_at, txt_at = 3 * singles + 6 * i, 3 * singles + 6 * (doubles + i)
            temb = torch.cat([table[:, img_at : img_at + 6], table[:, txt_at : txt_at + 6]], dim=1)
            txt, img = block(
                hidden_states=acts.img,
                encoder_hidden_states=acts.txt,
                temb=temb,
                image_rotary_emb=rope,
                attention_mask=mask,
            )
            return acts.replace(img=img, txt=txt)
        text = acts.txt.shape[1]
        joint = block(
            hidden_states=torch.cat([acts.txt, acts.img], dim=1),
            temb=table[:, 3 * i : 3 * i + 3],
            image_rotary_emb=rope,
            attention_mask=mask,
        )
        return acts.replace(txt=joint[:, :text], img=joint[:, text:])

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))


def _check_mask_layout(acts: Activations, mesh) -> None:
    check_mask_layout(acts, mesh, "Chroma")
