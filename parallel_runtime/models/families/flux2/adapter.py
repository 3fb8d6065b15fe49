"""FLUX.2 (Flux2Transformer2DModel): joint attention, modulation shared by all blocks, 4-axis RoPE, guidance.

Layout: ComfyUI's FLUX.2 LATENT is already the packed latent: the VAE's 32 channels in 2x2 patches
(128 channels at 1/16 of the image) normalised with the VAE's batch-norm statistics, which ComfyUI's
FLUX.2 VAE applies itself (latent format ``Flux2``: identity). A token is one pixel of it (patch 1),
as Flux2Pipeline's ``_pack_latents`` lays it out. Text tokens come first in every attention call.

The three modulation vectors (double blocks: image and text; single blocks) are computed once per
forward from the time/guidance embedding and carried in ``Activations.temb`` as one concatenated vector;
every block takes its slice. Single blocks are called with text and image apart
(``split_hidden_states``), so each sp rank's [text shard, image shard] is the same in both block kinds.
ComfyUI left-pads FLUX.2 text to 512 tokens with zeros (``model_base.Flux2``); shorter conditioning is
padded the same way here. Reference images (``comfy_inputs``) are appended after the image's tokens with their
ids, as Flux2Pipeline's ``image=`` appends them; the prediction keeps the image's tokens.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...base import Activations, Conditioning, ModelAdapter, ModelPlan, Split
from ...latent_formats import LatentFormat
from ...reference_latents import in_model_space, references_of
from ...sampling_spec import flux_sampling
from . import ID
from .latent import latent_format as flux2_latent_format

TEXT_TOKENS = 512  # ComfyUI pads FLUX.2 text to this many tokens (zeros in front)
DOUBLE, SINGLE = "transformer_blocks", "single_transformer_blocks"


class Flux2Adapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.FLUX2_ATTN_PROCESSOR, compat.FLUX2_SINGLE_ATTN_PROCESSOR)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        out = config.out_channels or config.in_channels
        if config.patch_size != 1 or config.in_channels != out:
            raise ConfigError(
                f"FLUX.2 transformer with patch_size={config.patch_size}, in_channels={config.in_channels}, "
                f"out_channels={out}",
                "only text-to-image FLUX.2 (packed 128-channel latents in and out, one token per latent pixel) is "
                "supported",
                "load a FLUX.2 dev transformer (flux2-dev*.safetensors or the diffusers folder)",
            )
        return ModelPlan(
            family=cls.family,
            block_lists=(DOUBLE, SINGLE),
            patch_size=1,
            patch_layout="pqc",
            latent_channels=out,
            out_channels=out,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=bool(config.guidance_embeds),
            timestep="sigma",
            latent_format=latent_format or flux2_latent_format(out),
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_rope", 0)),
            model_sampling=flux_sampling(2.02),  # ComfyUI's Flux2: ModelType.FLUX, shift 2.02 (as issue 14 found)
            vae_scale_factor=16,
        )

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        if self.plan.guidance_embed and guidance is None:
            raise ConfigError(
                "this FLUX.2 transformer needs a guidance value",
                "guidance-distilled FLUX.2 (dev) embeds the guidance scale as an input",
                "pass guidance (e.g. 4.0, Flux2Pipeline's guidance_scale; ComfyUI's FluxGuidance node)",
            )
        rows, cols = self.grid_of(x)
        tokens, ids = self.patchify(x), image_ids(rows, cols, x.device)
        refs = references_of(cond, "FLUX.2")
        if refs is not None:  # reference tokens after the image's, in model space
            ref = in_model_space(refs.tokens, self.plan.latent_format, 1, "pqc")
            tokens = torch.cat([tokens, ref.to(tokens.dtype)], dim=1)
            ids = torch.cat([ids, refs.ids[0].to(ids)])
        ts = timestep.to(tokens.dtype) * 1000
        g = guidance.to(tokens.dtype) * 1000 if self.plan.guidance_embed else None
        temb = t.time_guidance_embed(ts, g)
        mods = torch.cat(
            [
                t.double_stream_modulation_img(temb),
                t.double_stream_modulation_txt(temb),
                t.single_stream_modulation(temb),
            ],
            dim=-1,
        )
        txt = t.context_embedder(pad_text(cond.prompt_embeds))
        return Activations(
            img=t.x_embedder(tokens),
            txt=txt,
            temb=mods,
            temb_out=temb,
            grid=(rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=t.pos_embed(ids),
            txt_rope=t.pos_embed(text_ids(txt.shape[1], x.device)),
            ref_tokens=0 if refs is None else refs.tokens.shape[1],
        )

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        rope = tuple(torch.cat([a, b]) for a, b in zip(acts.txt_rope, acts.img_rope))
        d = self.transformer.inner_dim
        mod_img, mod_txt, mod_single = acts.temb.split([6 * d, 6 * d, 3 * d], dim=-1)
        if list_name == DOUBLE:
            txt, img = block(
                hidden_states=acts.img,
                encoder_hidden_states=acts.txt,
                temb_mod_img=mod_img,
                temb_mod_txt=mod_txt,
                image_rotary_emb=rope,
            )
        else:
            txt, img = block(
                hidden_states=acts.img,
                encoder_hidden_states=acts.txt,
                temb_mod=mod_single,
                image_rotary_emb=rope,
                split_hidden_states=True,
            )
        return acts.replace(img=img, txt=txt)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn]

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "first"  # both processors attend over [text, image]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))


def pad_text(text: torch.Tensor) -> torch.Tensor:
    """ComfyUI's FLUX.2 convention: text shorter than 512 tokens gets zero tokens in front."""
    missing = TEXT_TOKENS - text.shape[1]
    return torch.nn.functional.pad(text, (0, 0, missing, 0)) if missing > 0 else text


def image_ids(rows: int, cols: int, device: torch.device | None = None) -> torch.Tensor:
    """FLUX.2 image position ids [rows*cols, 4]: (t=0, row, col, l=0), row-major as Flux2Pipeline builds them."""
    ids = torch.zeros(rows, cols, 4, device=device)
    ids[..., 1] = torch.arange(rows, device=device)[:, None]
    ids[..., 2] = torch.arange(cols, device=device)[None, :]
    return ids.reshape(rows * cols, 4)


def text_ids(tokens: int, device: torch.device | None = None) -> torch.Tensor:
    """FLUX.2 text position ids [T, 4]: (0, 0, 0, i)."""
    ids = torch.zeros(tokens, 4, device=device)
    ids[:, 3] = torch.arange(tokens, device=device)
    return ids
