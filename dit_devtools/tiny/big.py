"""Tiny random-weight Qwen-Image and FLUX.2 pipelines (transformer, VAE, text encoder, tokenizer), for tests.

Structure follows the real models - Qwen-Image: dual-stream blocks, 2x2-packed 16-channel latents, the
Wan-style causal VAE, a Qwen2.5-VL text encoder with the chat special tokens; FLUX.2: double + single
blocks with shared modulation, guidance, a batch-norm VAE whose 2x2-packed latent is the model's input,
a Mistral3 text encoder whose hidden states of layers 10, 20 and 30 are stacked - sizes do not. The
tokenizers are real byte-level BPE tokenizers over a tiny vocabulary learned from a fixed corpus.
"""

from __future__ import annotations

import collections
import re
from typing import Any

import torch

from .vocab import CORPUS, bytes_to_unicode, learn_bpe_merges

SEED = 0
QWEN_TEXT_WIDTH = 24  # Qwen2.5-VL hidden size of the tiny encoder = the transformer's joint_attention_dim
MISTRAL_WIDTH = 16  # FLUX.2 text width = 3 x this (three hidden layers stacked)
MISTRAL_LAYERS = 31  # layers 10, 20, 30 are read, as Flux2Pipeline does
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MISTRAL_SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{% else %}[INST]{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{% if message['role'] == 'system' %}[/SYSTEM_PROMPT]{% else %}[/INST]{% endif %}{% endfor %}"
)
_EXTRA_CORPUS = """
Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships
of the objects and background. system user assistant
You are an AI that reasons about image descriptions. You give structured responses focusing on object
relationships, object attribution and actions without speculation.
"""


def _corpus() -> str:
    return CORPUS + _EXTRA_CORPUS


def byte_level_bpe(corpus: str, num_merges: int = 300) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A GPT-2-style byte-level BPE vocabulary (256 byte symbols, then learned merges; spaces attach to the
    following word) learned deterministically from ``corpus``."""
    table = bytes_to_unicode()
    vocab = list(table.values())
    words: collections.Counter[tuple[str, ...]] = collections.Counter()
    for word in re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+", corpus):
        words[tuple(table[b] for b in word.encode("utf-8"))] += 1
    merges = learn_bpe_merges(words, vocab, num_merges)
    return {tok: i for i, tok in enumerate(vocab)}, merges


def build_qwen_tokenizer():
    """A real ``Qwen2Tokenizer`` (byte-level BPE) with Qwen's chat special tokens; pads with <|endoftext|>."""
    from transformers import Qwen2Tokenizer

    vocab, merges = byte_level_bpe(_corpus())
    vocab = {**vocab, **{s: len(vocab) + i for i, s in enumerate(QWEN_SPECIALS[:1])}}
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges)
    tok.add_special_tokens({"additional_special_tokens": list(QWEN_SPECIALS[1:])})
    return tok


def build_mistral_tokenizer(max_length: int = 512):
    """A byte-level BPE fast tokenizer with Mistral's instruction/system tokens and a chat template that
    reads ``[{"role", "content": [{"type": "text", "text"}]}]`` messages as Flux2Pipeline builds them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = byte_level_bpe(_corpus())
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(MISTRAL_SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=max_length,
        chat_template=MISTRAL_CHAT_TEMPLATE,
    )


def qwen_text_encoder(tokenizer):
    """Tiny Qwen2.5-VL (2 text layers, a 1-block vision tower) whose last hidden state is 24 wide."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    heads = 2
    head_dim = QWEN_TEXT_WIDTH // heads
    section = head_dim // 2 // 3
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=QWEN_TEXT_WIDTH,
        intermediate_size=2 * QWEN_TEXT_WIDTH,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [section] * 3},
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = dict(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        out_hidden_size=QWEN_TEXT_WIDTH,
        fullatt_block_indexes=[0],
    )
    torch.manual_seed(SEED)
    ids = dict(bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    config = Qwen2_5_VLConfig(text_config={**text, **ids}, vision_config=vision, **ids)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def mistral_text_encoder(tokenizer):
    """Tiny Mistral3 (31 text layers so layers 10/20/30 exist, a 1-layer Pixtral tower)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=MISTRAL_WIDTH,
        intermediate_size=2 * MISTRAL_WIDTH,
        num_hidden_layers=MISTRAL_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=MISTRAL_WIDTH // 2,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
    )
    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=8,
        image_size=28,
        patch_size=14,
    )
    torch.manual_seed(SEED + 1)
    config = Mistral3Config(text_config=text, vision_config=vision, spatial_merge_size=1)
    return Mistral3ForConditionalGeneration(config).eval()


def qwen_image_vae():
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(SEED)
    return AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1).eval()


def flux2_vae(latent_channels: int = 4):
    from diffusers import AutoencoderKLFlux2

    torch.manual_seed(SEED)
    vae = AutoencoderKLFlux2(
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=64,
    ).eval()
    gen = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():  # batch-norm statistics that matter (defaults would be mean 0, var 1)
        vae.bn.running_mean.copy_(0.3 * torch.randn(vae.bn.running_mean.shape, generator=gen))
        vae.bn.running_var.copy_(0.5 + torch.rand(vae.bn.running_var.shape, generator=gen))
    return vae


def qwen_image(overrides: dict[str, Any]) -> dict[str, Any]:
    """Parts of a tiny QwenImagePipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel

    tok = build_qwen_tokenizer()
    encoder = qwen_text_encoder(tok)
    config = dict(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=QWEN_TEXT_WIDTH,
        axes_dims_rope=(4, 6, 6),
    )
    config.update(overrides)
    torch.manual_seed(SEED)
    return dict(
        cls=QwenImagePipeline,
        transformer=QwenImageTransformer2DModel(**config).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=1.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=0.9,
            base_image_seq_len=256,
            max_image_seq_len=8192,
            shift_terminal=0.02,
            time_shift_type="exponential",
        ),
        vae=qwen_image_vae(),
        text_encoder=encoder,
        tokenizer=tok,
    )


def flux2(overrides: dict[str, Any]) -> dict[str, Any]:
    """Parts of a tiny Flux2Pipeline (VAE latent 4 channels -> 16 packed channels per token)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline, Flux2Transformer2DModel

    tok = build_mistral_tokenizer()
    encoder = mistral_text_encoder(tok)
    vae = flux2_vae()
    config = dict(
        patch_size=1,
        in_channels=4 * vae.config.latent_channels,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=3 * MISTRAL_WIDTH,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=True,
    )
    config.update(overrides)
    torch.manual_seed(SEED)
    return dict(
        cls=Flux2Pipeline,
        transformer=Flux2Transformer2DModel(**config).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential"
        ),
        vae=vae,
        text_encoder=encoder,
        tokenizer=tok,
    )
