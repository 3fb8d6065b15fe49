"""The pieces the families' prompt encoders share: a pipeline's text parts, tokenizing as diffusers does,
and running a CLIP or T5 encoder of the pipeline (each family combines them in its folder's ``text.py``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..errors import ConfigError

log = logging.getLogger(__name__)


class TextComponents(Protocol):
    """What encoders read of a loaded pipeline (``loading.PipelineComponents`` has it)."""

    path: Path
    pipeline_class: str
    transformer_config: dict[str, Any]
    text_encoders: Mapping[str, nn.Module]
    tokenizers: Mapping[str, Any]


def device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def loaded_device_of(module: nn.Module) -> torch.device:
    """The device of the first parameter not on "meta" (a text model built with only the layers it needs)."""
    return next(p for p in module.parameters() if p.device.type != "meta").device


def dtype_of(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def tokenize(tokenizer, prompts: list[str], max_length: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to ``max_length`` and truncate, as diffusers does; log what truncation removed."""
    enc = tokenizer(prompts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt")
    full = tokenizer(prompts, truncation=False, verbose=False).input_ids
    for prompt, ids in zip(prompts, full):
        if len(ids) > max_length:
            log.warning("%s keeps %d of the %d tokens of the prompt %.60r", name, max_length, len(ids), prompt)
    return enc.input_ids, enc.attention_mask


def component(components: TextComponents, kind: str, name: str, family: str):
    """The text encoder (``kind`` "encoder") or tokenizer ``name``; a clear error when it was not loaded."""
    table = components.text_encoders if kind == "encoder" else components.tokenizers
    if name not in table:
        raise ConfigError(
            f"{family} text encoding needs {name!r}, which is not loaded from {components.path}",
            f"{family} conditions on the outputs of all of its text encoders",
            'load the pipeline with parts including "text" (and keep its tokenizer folders)',
        )
    return table[name]


def clip_length(components: TextComponents) -> int:
    """The CLIP tokenizer's length (77 when the pipeline has no ``tokenizer``)."""
    return components.tokenizers["tokenizer"].model_max_length if "tokenizer" in components.tokenizers else 77


def clip(components: TextComponents, index: str, prompts: list[str], max_length: int, family: str):
    """(output of CLIP encoder ``text_encoder{index}``, its dtype) with hidden states."""
    encoder = component(components, "encoder", f"text_encoder{index}", family)
    tokenizer = component(components, "tokenizer", f"tokenizer{index}", family)
    ids, _ = tokenize(tokenizer, prompts, max_length, f"text_encoder{index} (CLIP)")
    return encoder(ids.to(device_of(encoder)), output_hidden_states=True), dtype_of(encoder)


def t5(components: TextComponents, index: str, prompts: list[str], max_length: int, family: str, masked: bool):
    """(T5 last hidden state in the encoder's dtype, attention mask)."""
    encoder = component(components, "encoder", f"text_encoder{index}", family)
    tokenizer = component(components, "tokenizer", f"tokenizer{index}", family)
    ids, mask = tokenize(tokenizer, prompts, max_length, f"text_encoder{index} (T5)")
    dev = device_of(encoder)
    out = encoder(ids.to(dev), attention_mask=mask.to(dev) if masked else None)[0]
    return out.to(dtype_of(encoder)), mask
