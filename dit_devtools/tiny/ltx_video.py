"""Tiny random-weight LTX-Video 0.9 pipeline (diffusers folder) for tests and benchmarks.

Same rules as :mod:`.factory`: a complete diffusers folder built from configs with a fixed seed. Structure follows
the released 0.9.0 model, sizes do not: LTXPipeline with a tiny T5 (the prompt's states, not masked inside T5),
LTXVideoTransformer3DModel (patch 1, cross-attention to the text, 3-axis rotary positions) and
AutoencoderKLLTXVideo (32x spatial, 8x temporal, 128 latent channels, per-channel latent statistics set off
0 / 1 so the tests see them).
"""

from __future__ import annotations

from typing import Any

import torch

from .image import _t5_encoder
from .vocab import build_t5_tokenizer

SEED = 0
TEXT_WIDTH = 32  # T5 d_model = the transformer's caption_channels
LATENT_CHANNELS = 128  # the released VAE's; the transformer's in/out channels


def ltx_video_vae():
    """Tiny AutoencoderKLLTXVideo: patch 4, three spatio-temporal upsamplings (32x, 8x), RMS norms per pixel; the
    levels shaped like the released VAE's, so Lightricks' 0.9.0 file layout holds it."""
    from diffusers import AutoencoderKLLTXVideo

    torch.manual_seed(SEED)
    vae = AutoencoderKLLTXVideo(
        latent_channels=LATENT_CHANNELS,
        block_out_channels=(8, 16, 32, 32),  # the released widths' pattern (128, 256, 512, 512)
        decoder_block_out_channels=(8, 16, 32, 32),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
    )
    with torch.no_grad():
        vae.latents_mean.copy_(torch.randn(LATENT_CHANNELS) * 0.1)
        vae.latents_std.copy_(torch.rand(LATENT_CHANNELS) + 0.5)
    return vae.eval()


def ltx_video_transformer(seed: int = SEED, **overrides: Any):
    from diffusers import LTXVideoTransformer3DModel

    config = dict(
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=32,  # the released count (ComfyUI reads single files with 32 heads)
        attention_head_dim=2,
        cross_attention_dim=64,
        num_layers=2,
        caption_channels=TEXT_WIDTH,
    )
    config.update(overrides)
    torch.manual_seed(seed)
    model = LTXVideoTransformer3DModel(**config).eval()
    with torch.no_grad():  # lift the q/k RMS norms off 1 so the tests see them
        for name, param in model.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight")):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def tiny_ltx_video(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXPipeline

    tokenizer = build_t5_tokenizer(128)
    return dict(
        cls=LTXPipeline,
        transformer=ltx_video_transformer(**overrides),
        vae=ltx_video_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=1.0,
            use_dynamic_shifting=True,
            base_shift=0.95,
            max_shift=2.05,
            base_image_seq_len=1024,
            max_image_seq_len=4096,
            shift_terminal=0.1,
        ),
        text_encoder=_t5_encoder(tokenizer, TEXT_WIDTH),
        tokenizer=tokenizer,
    )


BUILDERS = {"tiny-ltx-video": tiny_ltx_video}
