"""FLUX.2 prompts, as Flux2Pipeline encodes them with Mistral-Small-3.1: the prompt as a chat (FLUX.2's system
message + the user text) padded to 512 tokens; the hidden states of layers 10, 20 and 30 stacked per token
(3 x the encoder width). Text-only: the vision tower is never run, and no layer after the last one read is
needed (``layers_needed``), so the loader builds the text model without them (``loader_options``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...base import Conditioning
from ...text_parts import TextComponents, component, loaded_device_of
from ..spec import TextEncoding
from . import ID

FLUX2_LENGTH = 512
FLUX2_LAYERS = (10, 20, 30)


def flux2_messages(prompts: Sequence[str]) -> list[list[dict]]:
    """FLUX.2's chat for each prompt: its system message, then the prompt as the user's text."""
    from ...compat import flux2_system_message

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
    device = loaded_device_of(encoder)
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


def encode(comps: TextComponents, prompts: list[str], length: int, device: torch.device) -> Conditioning:
    encoder = component(comps, "encoder", "text_encoder", ID)
    tokenizer = component(comps, "tokenizer", "tokenizer", ID)
    return encode_flux2(encoder, tokenizer, prompts, length).to(device)


def loader_options(folder: Path) -> dict[str, Any]:
    """from_pretrained options for the text encoder: FLUX.2 reads Mistral's hidden states of layers 10, 20 and
    30 only, so its text model is built with just the layers those need (31 of Mistral-Small's 40)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    text = getattr(config, "text_config", config)
    if text.num_hidden_layers <= layers_needed():
        return {}
    text.num_hidden_layers = layers_needed()
    return {"config": config}


ENCODING = TextEncoding(encode, loader_options=loader_options)
