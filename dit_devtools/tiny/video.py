"""Tiny random-weight Wan pipelines (diffusers folders) for tests and benchmarks.

Same rules as :mod:`.factory`: complete diffusers folders (model_index.json, safetensors, real tokenizer
files) built from configs with a fixed seed. Structure follows the real models, sizes do not:

- ``tiny-wan``: Wan 2.1 / 2.2 A14B text-to-video (WanPipeline: UMT5 + WanTransformer3DModel + 16-channel
  AutoencoderKLWan with Wan 2.1's latent statistics);
- ``tiny-wan-i2v``: Wan 2.1 I2V (WanImageToVideoPipeline: 36 input channels and CLIP-vision image K/V from
  a tiny CLIPVisionModel, whose penultimate states are what ComfyUI's CLIPVisionEncode hands to Wan);
- ``tiny-wan-a14b``: Wan 2.2 A14B two experts (``transformer`` high-noise, ``transformer_2`` low-noise,
  ``boundary_ratio``);
- ``tiny-wan-ti2v``: Wan 2.2 TI2V-5B (48-channel VAE with patch 2 and 16x compression, per-frame time).
"""

from __future__ import annotations

from typing import Any

import torch

from .vocab import build_t5_tokenizer

HEADS, HEAD_DIM = 4, 16  # rope splits the head as t 8, h 4, w 4
TEXT_DIM = 32
IMAGE_DIM = 48  # tiny stand-in for CLIP ViT-H's 1280-wide penultimate states
SEED = 0


def _umt5(tokenizer):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=len(tokenizer),
        d_model=TEXT_DIM,
        d_kv=8,
        d_ff=64,
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
    torch.manual_seed(SEED)
    return UMT5EncoderModel(config).eval()


def wan_vae(wan22: bool = False):
    """Tiny AutoencoderKLWan: Wan 2.1's (16 channels, 8x) or Wan 2.2's (48 channels, patch 2, 16x)."""
    from diffusers import AutoencoderKLWan

    from parallel_runtime.models.families.wan.latent import WAN21, WAN22

    torch.manual_seed(SEED)
    if wan22:
        vae = AutoencoderKLWan(
            base_dim=8,
            decoder_base_dim=16,
            z_dim=48,
            is_residual=True,
            patch_size=2,
            in_channels=12,
            out_channels=12,
            scale_factor_spatial=16,
            latents_mean=list(WAN22.mean),
            latents_std=list(WAN22.std),
        )
    else:
        vae = AutoencoderKLWan(base_dim=8, z_dim=16, latents_mean=list(WAN21.mean), latents_std=list(WAN21.std))
    with torch.no_grad():  # RMS-norm gammas off 1, so the tests see them
        for name, param in vae.named_parameters():
            if name.endswith("gamma"):
                param.add_(torch.randn_like(param) * 0.1)
    return vae.eval()


def wan_transformer(seed: int = SEED, **overrides: Any):
    from diffusers import WanTransformer3DModel

    config = dict(
        patch_size=(1, 2, 2),
        num_attention_heads=HEADS,
        attention_head_dim=HEAD_DIM,
        in_channels=16,
        out_channels=16,
        text_dim=TEXT_DIM,
        freq_dim=32,
        ffn_dim=96,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
    )
    config.update(overrides)
    torch.manual_seed(seed)
    return WanTransformer3DModel(**config).eval()


def _scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=8.0)


def _common(wan22_vae: bool = False) -> dict[str, Any]:
    tokenizer = build_t5_tokenizer(512)
    return dict(tokenizer=tokenizer, text_encoder=_umt5(tokenizer), vae=wan_vae(wan22_vae), scheduler=_scheduler())


def tiny_wan(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import WanPipeline

    return dict(cls=WanPipeline, transformer=wan_transformer(**overrides), **_common())


def tiny_wan_i2v(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import WanImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    transformer = wan_transformer(in_channels=36, image_dim=IMAGE_DIM, added_kv_proj_dim=HEADS * HEAD_DIM, **overrides)
    vision = CLIPVisionConfig(
        hidden_size=IMAGE_DIM,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
    )
    torch.manual_seed(SEED)
    encoder = CLIPVisionModel(vision).eval()
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return dict(
        cls=WanImageToVideoPipeline,
        transformer=transformer,
        image_encoder=encoder,
        image_processor=processor,
        **_common(),
    )


def tiny_wan_a14b(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import WanPipeline

    return dict(
        cls=WanPipeline,
        transformer=wan_transformer(SEED, **overrides),
        transformer_2=wan_transformer(SEED + 1, **overrides),
        boundary_ratio=0.875,  # Wan 2.2 A14B T2V's value
        **_common(),
    )


def tiny_wan_ti2v(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import WanPipeline

    transformer = wan_transformer(in_channels=48, out_channels=48, **overrides)
    return dict(cls=WanPipeline, transformer=transformer, expand_timesteps=True, **_common(True))


BUILDERS = {
    "tiny-wan": tiny_wan,
    "tiny-wan-i2v": tiny_wan_i2v,
    "tiny-wan-a14b": tiny_wan_a14b,
    "tiny-wan-ti2v": tiny_wan_ti2v,
}
