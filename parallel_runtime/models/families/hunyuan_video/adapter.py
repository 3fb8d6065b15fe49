"""HunyuanVideo 1.0 (HunyuanVideoTransformer3DModel): video tokens, 3-axis RoPE, joint [image, text] attention.

A latent [B, C, T, H, W] becomes one token per frame and 2x2 pixels (``x_embedder``), row-major over
(T, H/2, W/2). The prompt's Llama states pass the token refiner (``context_embedder``, its own attention over
the text, run whole on every rank) and then join the image tokens in every block's attention, image first and
text last (``HunyuanVideoAttnProcessor2_0``). Image tokens, their RoPE rows and the text tokens are split over
"sp" (a joint sequence, like Flux's). Each of the 20 double-stream and 40 single-stream blocks is one layer.

Text padding: a Conditioning's ``attention_mask`` marks padded tokens (diffusers pads prompts to 256). Padded
tokens only ever feed their own outputs, so the text is cut to the tokens some prompt of the batch keeps; when
every prompt keeps the same ones (one prompt, or ComfyUI's unpadded CONDITIONING) no mask is left and the result
is the padded one exactly. A batch of prompts of different lengths keeps a key mask, which one rank and CFG
parallel apply; sequence parallelism and PipeFusion refuse it.

Image-to-video: HunyuanVideo-I2V "v1" (33 input channels) reads the start-image latent and a 1-channel mask after
the latent's channels, as ComfyUI's ``HunyuanImageToVideo`` (v1, concat) hands them over (``comfy_inputs``). "v2"
(16 channels, ``HunyuanImageToVideo`` "v2 (replace)") keeps the start image on the latent's first frame (the LATENT's
noise mask) and modulates that frame's tokens with the guiding frame's vector (``token_replace``); a branch whose
conditioning carries no guiding frame (ComfyUI's negative) runs with one vector for every token.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Activations, Conditioning, LatentFormat, ModelAdapter, ModelPlan, Split
from ...sampling_spec import discrete_flow_sampling
from . import ID
from .conditioning import image_inputs, start_image_channels
from .latent import HUNYUAN_VIDEO
from .reference import reference_tokens
from .token_replace import TOKEN_REPLACE_BLOCKS, double_block, first_frame_flags, output_norm, single_block

ATTN_PROCESSOR = "HunyuanVideoAttnProcessor2_0"  # calls dispatch_attention_fn: SDPA on diffusers' native backend
SHIFT = 7.0  # ComfyUI 0.3.64 supported_models.HunyuanVideo sampling_settings (inherited by the I2V classes)
DEFAULT_GUIDANCE = 6.0  # ComfyUI model_base.HunyuanVideo.extra_conds: embedded guidance when none is given
GUIDANCE_SCALE = 1000.0  # the guidance value is embedded x1000 (diffusers' pipeline, ComfyUI's timestep_embedding)


class HunyuanVideoAdapter(ModelAdapter):
    family = ID
    sdpa_processors = (ATTN_PROCESSOR,)

    @classmethod
    def make_plan(cls, config: Any, latent_format: LatentFormat | None) -> ModelPlan:
        if config.patch_size_t != 1:
            raise ConfigError(
                f"HunyuanVideo transformer with temporal patch size {config.patch_size_t}",
                "every published HunyuanVideo model patches 1 frame x 2x2 pixels; the token bands assume it",
                "load a HunyuanVideo 1.0 transformer as published",
            )
        channels = config.out_channels or config.in_channels
        return ModelPlan(
            family=cls.family,
            block_lists=("transformer_blocks", "single_transformer_blocks"),
            patch_size=config.patch_size,
            patch_layout="cpq",  # proj_out's tokens are (c, p, q), as the transformer's own unpatchify reads them
            latent_channels=channels,
            out_channels=channels,
            learned_sigma=False,
            text_attention="joint",
            guidance_embed=bool(config.guidance_embeds),
            timestep="sigma_x1000",
            latent_format=latent_format or HUNYUAN_VIDEO,
            model_sampling=discrete_flow_sampling(SHIFT),  # ModelType.FLOW -> ModelSamplingDiscreteFlow
            pads_to_patch=False,  # whole tokens only (ComfyUI's video sizes are multiples of 16 px)
            splits=(Split("img", 1), Split("txt", 1), Split("img_rope", 0), Split("txt_mask", 1)),
            latent_dims=3,
            vae_temporal_factor=4,
            default_guidance=DEFAULT_GUIDANCE,
            inpaint_with_clean_latent=True,  # ComfyUI HunyuanVideo.scale_latent_inpaint: the kept frames stay clean
        )

    def joint_text_order(self, module: nn.Module) -> Literal["first", "last"]:
        return "last"  # the processor concatenates [image, text]

    # -- inputs ------------------------------------------------------------------------------------
    def embed(self, x, timestep, cond, mesh, guidance=None) -> Activations:
        text, keep = kept_text(cond.prompt_embeds, cond.attention_mask)
        check_text_split(text, keep, mesh.size("sp"), "sequence parallelism")
        return super().embed(x, timestep, cond, mesh, guidance)

    def embed_rows(self, x_band, rows, full_size, timestep, cond, mesh, guidance=None) -> Activations:
        text, keep = kept_text(cond.prompt_embeds, cond.attention_mask)
        check_text_split(text, keep, mesh.size("sp"), "PipeFusion", masks_allowed=False)
        return super().embed_rows(x_band, rows, full_size, timestep, cond, mesh, guidance)

    def embed_full(
        self, x: torch.Tensor, timestep: torch.Tensor, cond: Conditioning, guidance: torch.Tensor | None = None
    ) -> Activations:
        t = self.transformer
        if cond.pooled is None:
            raise ConfigError(
                "HunyuanVideo conditioning has no pooled text embedding",
                "HunyuanVideo adds CLIP-L's pooled output to its time embedding",
                "encode the prompt with both HunyuanVideo text encoders (Llama + CLIP-L): ComfyUI's DualCLIPLoader "
                "(type hunyuan_video) or Parallel Text Encode",
            )
        if self.plan.guidance_embed and guidance is None:
            raise ConfigError(
                "this HunyuanVideo transformer needs a guidance value",
                "guidance-distilled HunyuanVideo embeds the guidance scale as an input",
                f"pass guidance (ComfyUI's default is {DEFAULT_GUIDANCE})",
            )
        inputs = image_inputs(cond)
        x = start_image_channels(x, inputs, t.config.in_channels, self.plan.latent_format)
        frames, rows, cols = self.grid_of(x)
        text, keep = kept_text(cond.prompt_embeds, cond.attention_mask)
        embedded = None if guidance is None else guidance.to(x.dtype) * GUIDANCE_SCALE
        embedded = embedded if self.plan.guidance_embed else None
        temb, _ = t.time_text_embed(timestep, cond.pooled, embedded)
        rope = t.rope(x)
        if inputs.guiding_timestep is not None:  # "v2 (replace)": the first frame's vector, and which tokens take it
            guiding, _ = t.time_text_embed(inputs.guiding_timestep.to(timestep.dtype), cond.pooled, embedded)
            temb = torch.stack([temb, guiding], dim=1)
            rope = (*rope, first_frame_flags(frames, rows, cols, x.device))
        img, refs = t.x_embedder(x), 0
        if inputs.ref_latent is not None:  # "custom": the start image's tokens ride after the video's
            if inputs.guiding_timestep is not None:
                raise ConfigError(
                    "a HunyuanVideo conditioning with both a guiding frame ('v2 (replace)') and a reference latent",
                    "HunyuanImageToVideo sets one of them (its guidance_type)",
                    "use one HunyuanImageToVideo guidance type per conditioning",
                )
            ref, ref_rope = reference_tokens(t, inputs.ref_latent, x, self.plan.latent_format)
            img, refs = torch.cat([img, ref], dim=1), ref.shape[1]
            rope = tuple(torch.cat([a, b]) for a, b in zip(rope, ref_rope))
        txt = t.context_embedder(text, timestep, keep)
        return Activations(
            img=img,
            txt=txt,
            temb=temb,
            temb_out=temb,
            grid=(frames, rows, cols),
            txt_tokens=txt.shape[1],
            img_rope=rope,
            txt_mask=keep,
            ref_tokens=refs,
        )

    # -- phases ------------------------------------------------------------------------------------
    def call_block(self, list_name: str, block: nn.Module, acts: Activations) -> Activations:
        mask = None
        if acts.txt_mask is not None:  # prompts of different lengths: padded text keys are masked out
            image = acts.txt_mask.new_ones(acts.img.shape[0], acts.img.shape[1])
            mask = torch.cat([image, acts.txt_mask], dim=1)[:, None, None, :].bool()
        rope, first = acts.img_rope[:2], (acts.img_rope[2] if len(acts.img_rope) > 2 else None)
        if first is None and type(block).__name__ not in TOKEN_REPLACE_BLOCKS:
            img, txt = block(acts.img, acts.txt, acts.temb, mask, rope)
        else:  # per-token modulation (diffusers' token-replace blocks take it only as a count of leading tokens)
            run = double_block if list_name == "transformer_blocks" else single_block
            img, txt = run(block, acts.img, acts.txt, acts.temb, mask, rope, first)
        return acts.replace(img=img, txt=txt)

    def self_attention_modules(self, list_name: str, block: nn.Module) -> list[nn.Module]:
        return [block.attn]

    def project_out(self, acts: Activations) -> torch.Tensor:
        t = self.transformer
        if acts.temb_out.ndim == 3:  # ComfyUI modulates the output layer per token too
            return t.proj_out(output_norm(t.norm_out, acts.img, acts.temb_out, acts.img_rope[2]))
        return t.proj_out(t.norm_out(acts.img, acts.temb_out))


def kept_text(embeds: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The text tokens some prompt keeps, and the keep-mask [B, T] (None when every prompt keeps them all)."""
    if mask is None:
        return embeds, None
    keep = mask.bool()
    columns = keep.any(dim=0).nonzero().flatten()
    if columns.numel() == 0:
        raise ConfigError(
            "HunyuanVideo conditioning whose attention mask keeps no text token",
            "the blocks attend to the prompt's tokens; an all-zero mask leaves none",
            "encode a prompt (an empty prompt still keeps the template's end token)",
        )
    keep = keep[:, columns]
    text = embeds[:, columns]
    return text, (None if bool(keep.all()) else keep.to(text.dtype))


def check_text_split(
    text: torch.Tensor, keep: torch.Tensor | None, sp: int, layout: str, masks_allowed: bool = True
) -> None:
    """Refuse what the joint sequence (``kept_text``'s) cannot hold when split: a rank without text tokens
    (diffusers' blocks cut the text from the end of the sequence, which an empty share breaks) or a key mask
    across ranks."""
    if keep is not None and (sp > 1 or not masks_allowed):
        raise ConfigError(
            f"a batch of HunyuanVideo prompts of different lengths under {layout}",
            "their padded text tokens need a key mask, which split attention cannot apply",
            "encode the prompts one at a time (each keeps its own length), or run on one GPU or CFG parallel",
        )
    if sp > 1 and text.shape[1] < sp:
        raise ConfigError(
            f"a prompt of {text.shape[1]} text tokens split over {sp} sequence-parallel ranks",
            "each rank holds a share of the text tokens in HunyuanVideo's joint attention, so every rank needs one",
            f"use a prompt of at least {sp} tokens, or fewer ring / ulysses ranks (CFG parallel or PipeFusion)",
        )
