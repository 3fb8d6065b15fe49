"""Tiny random-weight HunyuanVideo 1.0 pipelines (diffusers folders) for tests and benchmarks.

Same rules as :mod:`.factory`: complete diffusers folders built from configs with a fixed seed. Structure follows
the real models, sizes do not:

- ``tiny-hunyuan-video``: HunyuanVideoPipeline: a Llama text encoder (3 layers: the pipeline reads the third-last
  hidden state) behind a real byte-level BPE tokenizer with Llama-3's header tokens, CLIP-L's tiny stand-in, the
  guidance-distilled transformer (double + single blocks, token refiner) and AutoencoderKLHunyuanVideo;
- ``tiny-hunyuan-video-i2v``: the 33-channel image-to-video transformer ("latent_concat", no guidance input) with
  the same text encoders and VAE (HunyuanVideoPipeline: its LLaVA image encoder is not part of this tiny).
"""

from __future__ import annotations

from typing import Any

import torch

from .big import byte_level_bpe
from .vocab import CORPUS, build_clip_tokenizer

SEED = 0
TEXT_WIDTH = 32  # Llama hidden size = the transformer's text_embed_dim
CLIP_WIDTH = 32  # CLIP-L stand-in width = pooled_projection_dim
LLAMA_SPECIALS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|pad|>")
_EXTRA_CORPUS = """
Describe the video by detailing the following aspects: 1. The main content and theme of the video.
2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.
3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.
4. background environment, light, style and atmosphere. 5. camera angles, movements, and transitions used
in the video: system user assistant
"""


def build_llama_tokenizer(max_length: int = 1024):
    """A byte-level BPE fast tokenizer with Llama-3's header tokens; prepends <|begin_of_text|>, pads right."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges = byte_level_bpe(CORPUS + _EXTRA_CORPUS)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(LLAMA_SPECIALS))
    bos = LLAMA_SPECIALS[0]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<|eot_id|>",
        pad_token="<|pad|>",
        model_max_length=max_length,
        padding_side="right",
    )


def llama_text_encoder(tokenizer):
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=2 * TEXT_WIDTH,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(SEED)
    return LlamaModel(config).eval()


def clip_text_encoder(tokenizer):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=CLIP_WIDTH,
        intermediate_size=2 * CLIP_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED + 1)
    return CLIPTextModel(config).eval()


def hunyuan_video_vae():
    """Tiny AutoencoderKLHunyuanVideo: 8x spatial, 4x temporal, GroupNorms of 4 groups, mid-block attention."""
    from diffusers import AutoencoderKLHunyuanVideo

    torch.manual_seed(SEED)
    vae = AutoencoderKLHunyuanVideo(block_out_channels=(8, 8, 16, 16), layers_per_block=1, norm_num_groups=4)
    with torch.no_grad():  # GroupNorm affine parameters off (1, 0), so the tests see them
        for name, param in vae.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return vae.eval()


def hunyuan_video_transformer(seed: int = SEED, **overrides: Any):
    from diffusers import HunyuanVideoTransformer3DModel

    config = dict(
        in_channels=16,
        out_channels=16,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=2,
        num_single_layers=2,
        num_refiner_layers=2,
        mlp_ratio=2.0,
        patch_size=2,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=TEXT_WIDTH,
        pooled_projection_dim=CLIP_WIDTH,
        rope_theta=256.0,
        rope_axes_dim=(4, 6, 6),
    )
    config.update(overrides)
    torch.manual_seed(seed)
    model = HunyuanVideoTransformer3DModel(**config).eval()
    with torch.no_grad():  # diffusers zero-initialises nothing here, but lift the q/k norms off 1
        for name, param in model.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight", "norm_added_q.weight", "norm_added_k.weight")):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def _parts(transformer) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline

    tokenizer = build_llama_tokenizer()
    clip_tokenizer = build_clip_tokenizer()
    return dict(
        cls=HunyuanVideoPipeline,
        transformer=transformer,
        vae=hunyuan_video_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=7.0),
        text_encoder=llama_text_encoder(tokenizer),
        tokenizer=tokenizer,
        text_encoder_2=clip_text_encoder(clip_tokenizer),
        tokenizer_2=clip_tokenizer,
    )


def tiny_hunyuan_video(overrides: dict[str, Any]) -> dict[str, Any]:
    return _parts(hunyuan_video_transformer(**overrides))


def tiny_hunyuan_video_i2v(overrides: dict[str, Any]) -> dict[str, Any]:
    transformer = hunyuan_video_transformer(
        in_channels=33, guidance_embeds=False, image_condition_type="latent_concat", **overrides
    )
    return _parts(transformer)


BUILDERS = {
    "tiny-hunyuan-video": tiny_hunyuan_video,
    "tiny-hunyuan-video-i2v": tiny_hunyuan_video_i2v,
}
