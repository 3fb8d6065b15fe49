"""Tiny random-weight HiDream-I1 pipeline (transformer, Flux's VAE, scheduler; no text encoders: HiDream's
conditioning comes from ComfyUI's encoders), for tests.

Structure follows the real model - double- then single-stream blocks with mixture-of-experts feed-forwards
(shared expert + top-2 of 4 routed), T5 and per-block Llama-3.1 text, pooled CLIPs, 2x2 patches of a 16-channel
latent, 128-wide heads' rotary split scaled to 16 (8/4/4) - sizes do not. Block k reads Llama layer k (the
published rule min(k, 31) for four blocks).
"""

from __future__ import annotations

from typing import Any

import torch

from .image import SEED, _vae

T5_WIDTH, LLAMA_WIDTH, POOLED_WIDTH = 32, 24, 20
CONFIG: dict[str, Any] = dict(
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    caption_channels=[T5_WIDTH, LLAMA_WIDTH],
    text_emb_dim=POOLED_WIDTH,
    num_routed_experts=4,
    num_activated_experts=2,
    axes_dims_rope=(8, 4, 4),
    max_resolution=(128, 128),
    llama_layers=[0, 1, 2, 3],
)


def hidream(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, HiDreamImagePipeline, HiDreamImageTransformer2DModel

    config = {**CONFIG, **overrides}
    torch.manual_seed(SEED)
    transformer = HiDreamImageTransformer2DModel(**config).eval()
    with torch.no_grad():  # MoEGate's weight is torch.empty-like in some versions: seeded values throughout
        for block in [*transformer.double_stream_blocks, *transformer.single_stream_blocks]:
            block.block.ff_i.gate.weight.normal_(0.0, 0.5)
            block.block.adaLN_modulation[1].weight.normal_(0.0, 0.05)  # zero in diffusers' init: make it count
    return dict(
        cls=HiDreamImagePipeline,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        vae=_vae(16, 0.3611, 0.1159, quant_conv=False),
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
        text_encoder_4=None,
        tokenizer_4=None,
    )


BUILDERS = {"tiny-hidream": hidream}


def random_conditioning(config: dict[str, Any], tokens: int = 128, seed: int = 0):
    """Random prompt embeddings in the shapes HiDream's conditioning takes for a transformer ``config`` (T5 states,
    pooled CLIPs, Llama-3.1 states of every layer the blocks read): what a speed measurement needs in place of
    ComfyUI's four text encoders."""
    from parallel_runtime.models.base import Conditioning
    from parallel_runtime.models.families.hidream.conditioning import HiDreamText

    t5_width, llama_width = config["caption_channels"]
    layers = max(config["llama_layers"]) + 1
    g = torch.Generator().manual_seed(seed)
    return Conditioning(
        torch.randn(1, tokens, t5_width, generator=g),
        torch.randn(1, config["text_emb_dim"], generator=g),
        None,
        HiDreamText(torch.randn(1, layers, tokens, llama_width, generator=g)),
    )


def random_prompts(overrides: dict[str, Any]):
    """(positive, negative) random conditionings for the tiny HiDream widened by ``overrides``."""
    config = {**CONFIG, **overrides}
    return random_conditioning(config, seed=0), random_conditioning(config, seed=1)


RANDOM_PROMPTS = {"tiny-hidream": random_prompts}  # for models whose prompts no worker encodes
