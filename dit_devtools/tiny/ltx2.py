"""Tiny random-weight LTX-2 pipeline (diffusers folder) for tests and benchmarks.

Same rules as :mod:`.factory`: a diffusers folder built from configs with a fixed seed. Structure follows the
released LTX-2.0 model ("split" rotary tables, double-precision frequencies, the audio stream and the audio<->video
cross-attentions present in every block), sizes do not: 2 blocks, 2 heads x 8 (video and audio). The folder holds
LTX2Pipeline's transformer, video VAE (AutoencoderKLLTX2Video: 32x spatial, 8x temporal, 128 latent channels,
per-channel statistics set off 0 / 1), scheduler (the release's dynamic-shift config) and text side: a tiny
Gemma-3 (Gemma3ForConditionalGeneration, 2 layers, a one-layer vision tower never used) with a small unigram
tokenizer (the release's is Gemma's; the pipeline pads either on the left), and LTX2TextConnectors (1 layer,
8 learned registers, "split" rotary tables). The audio VAE and vocoder are absent (video-only: the family's README).
"""

from __future__ import annotations

from typing import Any

import torch

SEED = 0
TEXT_WIDTH = 32  # the connectors' output width = the transformer's caption_channels
LATENT_CHANNELS = 128  # the released VAE's; the transformer's in/out channels


def ltx2_vae():
    """Tiny AutoencoderKLLTX2Video with the release's level pattern (patch 4, three spatio-temporal levels)."""
    from diffusers import AutoencoderKLLTX2Video

    torch.manual_seed(SEED)
    vae = AutoencoderKLLTX2Video(
        latent_channels=LATENT_CHANNELS,
        block_out_channels=(8, 16, 32, 32),
        decoder_block_out_channels=(8, 16, 32),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        decoder_causal=False,  # the release's decoder
        spatial_compression_ratio=32,  # stated, as the release's config does (the levels alone would say 64)
        temporal_compression_ratio=8,
    )
    with torch.no_grad():
        vae.latents_mean.copy_(torch.randn(LATENT_CHANNELS) * 0.1)
        vae.latents_std.copy_(torch.rand(LATENT_CHANNELS) + 0.5)
    return vae.eval()


def ltx2_audio_vae():
    """Tiny AutoencoderKLLTX2Audio fitting the tiny transformer's audio stream (4 latent channels x 16 / 4 mel bins =
    its 16 audio channels), for running LTX2Pipeline itself (it needs one for the audio latents' shape and
    statistics); not part of the folder, which stays video-only."""
    from diffusers import AutoencoderKLLTX2Audio

    torch.manual_seed(SEED)
    return AutoencoderKLLTX2Audio(
        base_channels=16, ch_mult=(1, 2, 4), num_res_blocks=1, latent_channels=4, mel_bins=16
    ).eval()


def ltx2_transformer(seed: int = SEED, **overrides: Any):
    from diffusers import LTX2VideoTransformer3DModel

    config = dict(
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=16,
        audio_out_channels=16,
        audio_num_attention_heads=2,
        audio_attention_head_dim=8,
        audio_cross_attention_dim=16,
        num_layers=2,
        caption_channels=TEXT_WIDTH,
        rope_type="split",
        rope_double_precision=True,
    )
    config.update(overrides)
    torch.manual_seed(seed)
    model = LTX2VideoTransformer3DModel(**config).eval()
    with torch.no_grad():  # lift the q/k RMS norms off 1 so the tests see them
        for name, param in model.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight")):
                param.add_(torch.randn_like(param) * 0.1)
    return model


GEMMA_LAYERS = 2


def ltx2_text_encoder(vocab_size: int, pad_token_id: int):
    """Tiny Gemma3ForConditionalGeneration: the text model LTX2Pipeline reads every hidden state of."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(
        vocab_size=vocab_size + 3,  # + the image markers, kept out of the tokenizer's ids
        hidden_size=TEXT_WIDTH,
        intermediate_size=64,
        num_hidden_layers=GEMMA_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=2048,
        sliding_window=16,
        pad_token_id=pad_token_id,
    )
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)  # fmt: skip
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=vocab_size,
        eoi_token_index=vocab_size + 1,
        image_token_index=vocab_size + 2,
    )
    torch.manual_seed(SEED)
    return Gemma3ForConditionalGeneration(config).eval()


def ltx2_connectors():
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    torch.manual_seed(SEED)
    return LTX2TextConnectors(
        caption_channels=TEXT_WIDTH,
        text_proj_in_factor=GEMMA_LAYERS + 1,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=16,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=16,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8,
        rope_type="split",
    ).eval()


def ltx2_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=1.0,
        use_dynamic_shifting=True,
        base_shift=0.95,
        max_shift=2.05,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        time_shift_type="exponential",
    )


def tiny_ltx2(overrides: dict[str, Any]) -> dict[str, Any]:
    from diffusers import LTX2Pipeline

    from .vocab import build_t5_tokenizer

    tokenizer = build_t5_tokenizer(1024)
    return dict(
        cls=LTX2Pipeline,
        transformer=ltx2_transformer(**overrides),
        vae=ltx2_vae(),
        scheduler=ltx2_scheduler(),
        text_encoder=ltx2_text_encoder(len(tokenizer), tokenizer.pad_token_id),
        tokenizer=tokenizer,
        connectors=ltx2_connectors(),
        audio_vae=None,
        vocoder=None,
    )


BUILDERS = {"tiny-ltx2": tiny_ltx2}
