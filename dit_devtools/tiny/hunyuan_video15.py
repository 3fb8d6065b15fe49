"""A tiny random-weight HunyuanVideo 1.5 text-to-video pipeline (diffusers folder) for tests and benchmarks.

``tiny-hunyuan-video-1.5``: HunyuanVideo15Pipeline with a Qwen2.5-VL text model (3 layers: the pipeline reads the
third-last hidden state) behind a real byte-level BPE tokenizer with a ChatML chat template, ByT5 (its real byte
tokenizer, a 2-layer encoder) for quoted text, the double-stream transformer (condition-latent channels, token
refiner, glyph and vision projections) and AutoencoderKLHunyuanVideo15 (16x spatial, 4x temporal).
"""

from __future__ import annotations

from typing import Any

import torch

from .big import build_qwen_tokenizer

SEED = 0
TEXT_WIDTH = 32  # Qwen2.5-VL hidden size = the transformer's text_embed_dim
GLYPH_WIDTH = 32  # ByT5 d_model = text_embed_2_dim
LATENT = 8  # VAE latent channels
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def qwen_text_model(tokenizer):
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=2 * TEXT_WIDTH,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 1, 1]},
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    return Qwen2_5_VLTextModel(config).eval()


def byt5_encoder():
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=384,
        d_model=GLYPH_WIDTH,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED + 1)
    return T5EncoderModel(config).eval()


def hunyuan_video15_vae():
    from diffusers import AutoencoderKLHunyuanVideo15

    torch.manual_seed(SEED)
    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=LATENT, block_out_channels=(16, 16, 32, 32, 32), layers_per_block=1
    )
    with torch.no_grad():  # RMS-norm gammas off 1, so the tests see them
        for name, param in vae.named_parameters():
            if name.endswith("gamma"):
                param.add_(torch.randn_like(param) * 0.1)
    return vae.eval()


def hunyuan_video15_transformer(**overrides: Any):
    from diffusers import HunyuanVideo15Transformer3DModel

    config = dict(
        in_channels=2 * LATENT + 1,
        out_channels=LATENT,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=2,
        num_refiner_layers=2,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=TEXT_WIDTH,
        text_embed_2_dim=GLYPH_WIDTH,
        image_embed_dim=16,
        rope_axes_dim=(4, 6, 6),
        target_size=480,
        task_type="t2v",
    )
    config.update(overrides)
    torch.manual_seed(SEED)
    return HunyuanVideo15Transformer3DModel(**config).eval()


def tiny_hunyuan_video15(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from transformers import ByT5Tokenizer

    tokenizer = build_qwen_tokenizer()
    tokenizer.chat_template = CHATML
    return dict(
        cls=HunyuanVideo15Pipeline,
        transformer=hunyuan_video15_transformer(**overrides),
        vae=hunyuan_video15_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=7.0),
        text_encoder=qwen_text_model(tokenizer),
        tokenizer=tokenizer,
        text_encoder_2=byt5_encoder(),
        tokenizer_2=ByT5Tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )


BUILDERS = {"tiny-hunyuan-video-1.5": tiny_hunyuan_video15}
