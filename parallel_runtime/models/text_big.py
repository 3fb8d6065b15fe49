"""Prompt -> Conditioning for Qwen-Image (Qwen2.5-VL) and FLUX.2 (Mistral-Small-3.1), as their pipelines do.

- qwen-image: the prompt in Qwen-Image's chat template; the last hidden state; the template's prefix
  tokens (system message + "user") dropped; a batch padded to its longest prompt with a mask (no mask
  when nothing is padded), at most ``max_sequence_length`` tokens (QwenImagePipeline's default 512).
  The prefix length is counted with the tokenizer (34 with Qwen's own; QwenImagePipeline hard-codes 34,
  ComfyUI finds the same place by searching the tokens).
- flux2: the prompt as a chat (FLUX.2's system message + the user text) padded to 512 tokens; the hidden
  states of layers 10, 20 and 30 stacked per token (3 x the encoder width).
Text-only: the vision towers of both encoders are never run, and FLUX.2 needs no layer after the last
one read (``layers_needed``), so a loader may leave them out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .base import Conditioning

QWEN_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
QWEN_MAX_TOKENS = 1024  # tokens after the template prefix that the tokenizer keeps
QWEN_DEFAULT_LENGTH = 512
FLUX2_LENGTH = 512
FLUX2_LAYERS = (10, 20, 30)


def _device_of(module: nn.Module) -> torch.device:
    return next(p for p in module.parameters() if p.device.type != "meta").device


def qwen_prefix_tokens(tokenizer) -> int:
    """Tokens of the template before the prompt (34 for Qwen2.5-VL's tokenizer)."""
    return len(tokenizer(QWEN_TEMPLATE.split("{}")[0]).input_ids)


@torch.no_grad()
def encode_qwen_image(
    encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = QWEN_DEFAULT_LENGTH
) -> Conditioning:
    """Qwen-Image conditioning of ``prompts`` (on the encoder's device, in its dtype)."""
    drop = qwen_prefix_tokens(tokenizer)
    device = _device_of(encoder)
    texts = [QWEN_TEMPLATE.format(p) for p in prompts]
    tokens = tokenizer(texts, max_length=QWEN_MAX_TOKENS + drop, padding=True, truncation=True, return_tensors="pt")
    ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
    hidden = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    kept = [h[m.bool()][drop:] for h, m in zip(hidden, mask)]
    length = max(k.shape[0] for k in kept)
    embeds = torch.stack([torch.cat([k, k.new_zeros(length - k.shape[0], k.shape[1])]) for k in kept])
    valid = torch.stack([torch.arange(length, device=device) < k.shape[0] for k in kept]).long()
    embeds, valid = embeds[:, :max_sequence_length], valid[:, :max_sequence_length]
    return Conditioning(embeds, None, None if bool(valid.all()) else valid)


def flux2_messages(prompts: Sequence[str]) -> list[list[dict]]:
    """FLUX.2's chat for each prompt: its system message, then the prompt as the user's text."""
    from .compat import flux2_system_message

    def text(value: str) -> list[dict]:
        return [{"type": "text", "text": value}]

    system = flux2_system_message()
    return [
        [{"role": "system", "content": text(system)}, {"role": "user", "content": text(p.replace("[IMG]", ""))}]
        for p in prompts
    ]


def layers_needed(layers: Sequence[int] = FLUX2_LAYERS) -> int:
    """Decoder layers a text model must keep for ``hidden_states[k]`` of every k in ``layers`` (k + 1 layers:
    the last entry of hidden_states is normalised, so the layer after the last one read stays)."""
    return max(layers) + 1


@torch.no_grad()
def encode_flux2(
    encoder: nn.Module,
    tokenizer,
    prompts: Sequence[str],
    max_sequence_length: int = FLUX2_LENGTH,
    layers: Sequence[int] = FLUX2_LAYERS,
) -> Conditioning:
    """FLUX.2 conditioning of ``prompts``: [B, max_sequence_length, len(layers) x width]."""
    device = _device_of(encoder)
    inputs = tokenizer.apply_chat_template(
        flux2_messages(prompts),
        add_generation_prompt=False,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        padding="max_length",
        truncation=True,
        max_length=max_sequence_length,
    )
    out = encoder(
        input_ids=inputs["input_ids"].to(device),
        attention_mask=inputs["attention_mask"].to(device),
        output_hidden_states=True,
        use_cache=False,
    )
    stacked = torch.stack([out.hidden_states[k] for k in layers], dim=2)  # [B, T, L, D]
    return Conditioning(stacked.reshape(*stacked.shape[:2], -1))
