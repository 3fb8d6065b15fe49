"""Tiny random-weight Chroma pipeline (transformer, Flux's VAE, T5 text encoder and tokenizer), for tests.

Structure follows the real model - double + single blocks without per-block modulation weights, every
modulation read from the distilled-guidance "approximator" at its own index, 2x2-packed 16-channel latents,
T5 only - sizes do not.
"""

from __future__ import annotations

from typing import Any

import torch

from .image import SEED, _t5_encoder, _vae
from .vocab import build_t5_tokenizer


def chroma(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import ChromaPipeline, ChromaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    t5_tok = build_t5_tokenizer(512)
    t5 = _t5_encoder(t5_tok, 32)
    config = dict(
        patch_size=1,
        in_channels=64,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
        approximator_num_channels=64,  # the real width: 16 timestep + 16 guidance + 32 index features
        approximator_hidden_dim=48,
        approximator_layers=2,
    )
    config.update(overrides)
    torch.manual_seed(SEED)
    return dict(
        cls=ChromaPipeline,
        transformer=ChromaTransformer2DModel(**config).eval(),
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
        text_encoder=t5,
        tokenizer=t5_tok,
        image_encoder=None,
        feature_extractor=None,
    )


BUILDERS = {"tiny-chroma": chroma}
