"""Tiny random-weight Flux.1, SD3 and PixArt pipelines (transformer, VAE, text encoders, tokenizers).

Structure follows the real models (Flux: double + single blocks, guidance embedding, 3-axis rope; SD3.5:
joint blocks with a dual-attention block and RMS qk-norm; PixArt-alpha: cross-attention, learned sigma,
resolution conditions), sizes do not. Each builder returns the pipeline class and its parts.
"""

from __future__ import annotations

from typing import Any

import torch

from .vocab import build_clip_tokenizer, build_t5_tokenizer

SEED = 0


# -- text encoders, VAE, schedulers --------------------------------------------------------------
def _clip_encoder(tokenizer, hidden: int, projection: bool, act: str = "quick_gelu", seed: int = SEED):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=hidden,
        hidden_act=act,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def _t5_encoder(tokenizer, d_model: int, seed: int = SEED):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=d_model * 2,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return T5EncoderModel(config).eval()


def _vae(latent_channels: int, scaling: float, shift: float | None, quant_conv: bool):
    """Tiny AutoencoderKL with the real 8x downsampling (4 levels)."""
    from diffusers import AutoencoderKL

    torch.manual_seed(SEED)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
        latent_channels=latent_channels,
        sample_size=64,
        scaling_factor=scaling,
        shift_factor=shift,
        use_quant_conv=quant_conv,
        use_post_quant_conv=quant_conv,
    ).eval()


def _rope_axes(head_dim: int) -> tuple[int, int, int]:
    """Flux-style rope split of a head dim: (16, 56, 56) for 128; each part even."""
    side = (head_dim * 7 // 16) // 2 * 2
    return (head_dim - 2 * side, side, side)


# -- families -----------------------------------------------------------------------------------
def flux(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    clip_tok, t5_tok = build_clip_tokenizer(), build_t5_tokenizer(512)
    clip, t5 = _clip_encoder(clip_tok, 32, projection=False), _t5_encoder(t5_tok, 32)
    config = dict(
        patch_size=1,
        in_channels=64,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
    )
    config.update(overrides)
    config.setdefault("axes_dims_rope", _rope_axes(config["attention_head_dim"]))
    torch.manual_seed(SEED)
    return dict(
        cls=FluxPipeline,
        transformer=FluxTransformer2DModel(**config).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=_vae(16, 0.3611, 0.1159, quant_conv=False),
        text_encoder=clip,
        tokenizer=clip_tok,
        text_encoder_2=t5,
        tokenizer_2=t5_tok,
    )


def sd3(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    tok_l, tok_g, t5_tok = build_clip_tokenizer(), build_clip_tokenizer(pad_token="!"), build_t5_tokenizer(512)
    clip_l = _clip_encoder(tok_l, 32, projection=True, seed=SEED)
    clip_g = _clip_encoder(tok_g, 48, projection=True, act="gelu", seed=SEED + 1)
    t5 = _t5_encoder(t5_tok, 96)  # >= 32 + 48: CLIP features are zero-padded to T5's width
    config = dict(
        sample_size=16,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=96,
        pooled_projection_dim=80,
        pos_embed_max_size=32,
        dual_attention_layers=(0,),
        qk_norm="rms_norm",
    )
    config.update(overrides)
    config.setdefault("caption_projection_dim", config["num_attention_heads"] * config["attention_head_dim"])
    torch.manual_seed(SEED)
    return dict(
        cls=StableDiffusion3Pipeline,
        transformer=SD3Transformer2DModel(**config).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        vae=_vae(16, 1.5305, 0.0609, quant_conv=False),
        text_encoder=clip_l,
        tokenizer=tok_l,
        text_encoder_2=clip_g,
        tokenizer_2=tok_g,
        text_encoder_3=t5,
        tokenizer_3=t5_tok,
    )


def pixart(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel

    t5_tok = build_t5_tokenizer(512)
    t5 = _t5_encoder(t5_tok, 32)
    config = dict(
        num_attention_heads=4,
        attention_head_dim=24,  # inner dim divisible by 3 (resolution + aspect conditions split it)
        in_channels=4,
        out_channels=8,  # learned sigma
        num_layers=3,
        caption_channels=32,
        sample_size=128,  # PixArt-alpha 1024: the pipeline feeds resolution/aspect conditions only then
        patch_size=2,
        use_additional_conditions=True,
        norm_type="ada_norm_single",
        num_embeds_ada_norm=1000,
        norm_elementwise_affine=False,
        norm_eps=1e-6,
    )
    config.update(overrides)
    config.setdefault("cross_attention_dim", config["num_attention_heads"] * config["attention_head_dim"])
    torch.manual_seed(SEED)
    return dict(
        cls=PixArtAlphaPipeline,
        transformer=PixArtTransformer2DModel(**config).eval(),
        scheduler=DPMSolverMultistepScheduler(
            num_train_timesteps=1000,
            beta_start=0.0001,
            beta_end=0.02,
            beta_schedule="linear",
            prediction_type="epsilon",
            solver_order=2,
            algorithm_type="dpmsolver++",
            solver_type="midpoint",
            lower_order_final=True,
        ),
        vae=_vae(4, 0.18215, None, quant_conv=True),
        text_encoder=t5,
        tokenizer=t5_tok,
    )


BUILDERS = {"tiny-flux": flux, "tiny-sd3": sd3, "tiny-pixart": pixart}
