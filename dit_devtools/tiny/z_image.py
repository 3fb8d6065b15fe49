"""A tiny random-weight Z-Image pipeline (transformer, Flux-style VAE, Qwen3 text encoder, tokenizer), for tests.

Structure follows Z-Image-Turbo: noise and context refiners, modulated main layers, 3-axis rotary split
(head/4, 3/8, 3/8), learned pad tokens (randomised here: the released ones are not zero either), the Flux VAE's
16 channels and scale/shift, a Qwen3 encoder read at its second-to-last hidden state, and a tokenizer with
Qwen's chat special tokens and a chat template that renders a user turn as Qwen3's does. Sizes do not follow.
"""

from __future__ import annotations

from typing import Any

import torch

from .big import build_qwen_tokenizer
from .image import _vae

SEED = 0
QWEN3_WIDTH = 16  # the tiny Qwen3's hidden size = the transformer's cap_feat_dim
QWEN3_CHAT_TEMPLATE = (  # Qwen3's template for plain user turns (enable_thinking=True adds nothing)
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)


def qwen3_tokenizer():
    tok = build_qwen_tokenizer()
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


def qwen3_text_encoder(tokenizer):
    """Tiny Qwen3 (2 layers: the second-to-last hidden state is the first layer's output), 16 wide."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=QWEN3_WIDTH,
        intermediate_size=2 * QWEN3_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED + 3)
    return Qwen3Model(config).eval()


def z_image(overrides: dict[str, Any]) -> dict[str, Any]:
    """Parts of a tiny ZImagePipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    tok = qwen3_tokenizer()
    config = dict(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        qk_norm=True,
        cap_feat_dim=QWEN3_WIDTH,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[4, 6, 6],
        axes_lens=[1536, 512, 512],
    )
    config.update(overrides)
    torch.manual_seed(SEED)
    transformer = ZImageTransformer2DModel(**config).eval()
    with torch.no_grad():
        transformer.x_pad_token.normal_()
        transformer.cap_pad_token.normal_()
    return dict(
        cls=ZImagePipeline,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
        vae=_vae(16, 0.3611, 0.1159, quant_conv=False),
        text_encoder=qwen3_text_encoder(tok),
        tokenizer=tok,
    )
