"""Flux.1 (FluxTransformer2DModel): joint text+image attention, 3-axis rotary ids, guidance input.

Kontext's reference images (``models.reference_latents``) are appended to the image tokens with their ids
and split over the sp ranks with them; the output layer's result keeps the image's tokens. FLUX.1 Fill takes
InpaintModelConditioning's image and mask as extra input channels (``fill``), joined to the latent before it
is cut into tokens, so every layout (sp shards, PipeFusion bands, CFG branches) gets them with its tokens.

Layout: the model-space latent [B,16,H,W] is packed into 2x2 patches (channel order c,p,q, as
FluxPipeline packs it), so a token is 64 values; text tokens come first in every attention call.
Each sp rank holds [its text shard, its image shard] plus the rotary rows of exactly those tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ... import compat
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...reference_latents import in_model_space, references_of
from ...sampling_spec import discrete_flow_sampling, flux_sampling
from . import ID
from .fill import FILL_FACTOR, fill_channels, fill_inputs_of, is_fill
from .latent import latent_format as flux_latent_format

PACK = 2  # FluxPipeline packs 2x2 latent pixels into one token


class FluxAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (compat.FLUX_ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        out = config.out_channels or config.in_channels
        channels = out // (PACK * PACK)
        plain_or_fill = config.in_channels == out or is_fill(config.in_channels, channels, PACK)
        if config.patch_size != 1 or not plain_or_fill or out % (PACK * PACK):
            raise ConfigError(
                f"Flux transformer with patch_size={config.patch_size}, in_channels={config.in_channels}, "
                f"out_channels={out}",
                "Flux takes packed 2x2 latents in and gives the same channels out, or (Fill) reads the inpainting "
                f"image and mask too ({FILL_FACTOR}x the channels in); other extra-channel variants (Depth, "
                "Canny) are not supported",
                "load a FLUX.1 dev, schnell, Kontext or Fill transformer",
            )
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks", "single_transformer_blocks"),
            patch_size=PACK,
            patch_layout="cpq",
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=bool(config.guidance_embeds),
            timestep="sigma",
            latent_format=latent_format or flux_latent_format(channels),
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_rope", 0)),
            # ComfyUI: Flux dev (guidance input) ModelSamplingFlux shift 1.15; schnell discrete flow 1.0 / 1.0
            model_sampling=flux_sampling(1.15) if config.guidance_embeds else discrete_flow_sampling(1.0, 1.0),
        )

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        if cond.pooled is None:
            raise ConfigError(
                "Flux conditioning has no pooled text embedding",
                "Flux's time embedding adds the pooled CLIP-L output",
                "encode the prompt with both Flux text encoders (CLIP-L pooled + T5)",
            )
        if self.plan.guidance_embed and guidance is None:
            raise ConfigError(
                "this Flux transformer needs a guidance value",
                "guidance-distilled Flux (dev) embeds the guidance scale as an input",
                "pass guidance (e.g. 3.5), as FluxPipeline's guidance_scale",
            )
        x = self.condition_channels(x, cond)
        rows, cols = self.grid_of(x)
        patches, ids = self.patchify(x), image_ids(rows, cols, x.device)
        refs = None if fill_inputs_of(cond) is not None else references_of(cond, "FLUX.1")
        if refs is not None:  # Kontext: reference tokens after the image's, in model space
            ref = in_model_space(refs.tokens, self.plan.latent_format, PACK, "cpq")
            patches = torch.cat([patches, ref.to(patches.dtype)], dim=1)
            ids = torch.cat([ids, refs.ids[0].to(ids)])
        img = t.x_embedder(patches)
        ts = timestep.to(img.dtype) * 1000
        if self.plan.guidance_embed:
            temb = t.time_text_embed(ts, guidance.to(img.dtype) * 1000, cond.pooled)
        else:
            temb = t.time_text_embed(ts, cond.pooled)
        txt = t.context_embedder(cond.prompt_embeds)
        return Activations(
            img=img,
            txt=txt,
            temb=temb,
            temb_out=temb,
            grid=(rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=t.pos_embed(ids),
            txt_rope=t.pos_embed(torch.zeros(txt.shape[1], 3, device=x.device)),
            ref_tokens=0 if refs is None else refs.tokens.shape[1],
        )

    def condition_channels(self, x: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """``x`` with FLUX.1 Fill's image and mask channels (``fill``); ``x`` itself for every other model.
        ``x`` may be padded to whole patches from the image latent's size: the channels are then made at that
        size and padded with the latent (ComfyUI pads the joined input as one)."""
        inputs = fill_inputs_of(cond)
        if self.transformer.config.in_channels == self.plan.out_channels * PACK * PACK:
            if inputs is not None:
                raise ConfigError(
                    "an inpainting image and mask (InpaintModelConditioning) given to a FLUX.1 model without "
                    "extra input channels",
                    "only FLUX.1 Fill (384 input features) reads them; this model would ignore them",
                    "load flux1-fill-dev, or inpaint with a noise mask only (SetLatentNoiseMask)",
                )
            return x
        if inputs is None:
            raise ConfigError(
                "a FLUX.1 Fill model sampled without an inpainting image and mask",
                "Fill reads the image to complete and the mask of what to repaint as extra input channels",
                "put InpaintModelConditioning between the prompt and the sampler (both conditionings)",
            )
        (rows, cols), (h, w) = x.shape[-2:], inputs.concat_image.shape[-2:]
        padded = (h, w) != (rows, cols) and (rows, cols) == (h + -h % PACK, w + -w % PACK)
        if padded and self.plan.pads_to_patch:
            return self.pad_to_patch(fill_channels(x[..., :h, :w], inputs, self.plan.latent_format))
        return fill_channels(x, inputs, self.plan.latent_format)

    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        rope = tuple(torch.cat([a, b]) for a, b in zip(acts.txt_rope, acts.img_rope))
        txt, img = block(hidden_states=acts.img, encoder_hidden_states=acts.txt, temb=acts.temb, image_rotary_emb=rope)
        return acts.replace(img=img, txt=txt)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))


def image_ids(rows: int, cols: int, device: torch.device | None = None) -> torch.Tensor:
    """Flux image position ids [rows*cols, 3]: (0, row, col), row-major as FluxPipeline builds them."""
    ids = torch.zeros(rows, cols, 3, device=device)
    ids[..., 1] = torch.arange(rows, device=device)[:, None]
    ids[..., 2] = torch.arange(cols, device=device)[None, :]
    return ids.reshape(rows * cols, 3)
