"""Prompt -> Conditioning with a pipeline's own text encoders, matching diffusers' encode_prompt.

Per family (defaults as the diffusers pipelines use them):
- flux:   CLIP-L pooled output (77 tokens) -> pooled; T5 last hidden state (512 tokens) -> tokens.
- sd3:    CLIP-L and CLIP-G penultimate hidden states (77 tokens, concatenated, zero-padded to
          T5's width) followed by T5 (256 tokens) -> tokens; CLIP-L + CLIP-G projections -> pooled.
- pixart: prompt lower-cased and stripped (encode_prompt's clean_caption=False path); T5 with its
          attention mask (120 tokens for alpha, 300 for sigma) -> tokens + mask.
- qwen-image, flux2: Qwen2.5-VL / Mistral-Small-3.1 through their chat templates (``text_big``).
- wan:    prompt cleaned as the Wan pipelines do (ftfy when installed, HTML entities, whitespace); UMT5
          with its attention mask (512 tokens), states past the prompt's tokens zeroed -> tokens.
Each encoder runs on the device its weights are on; results are moved to ``device``.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import ConfigError
from .base import Conditioning
from .loading import PipelineComponents

log = logging.getLogger(__name__)

T5_LENGTH = {"flux": 512, "sd3": 256, "pixart": 120, "qwen-image": 512, "flux2": 512, "wan": 512}  # tokens per family
PIXART_SIGMA_LENGTH = 300


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def _dtype_of(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def _tokenize(tokenizer, prompts: list[str], max_length: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad to ``max_length`` and truncate, as diffusers does; log what truncation removed."""
    enc = tokenizer(prompts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt")
    full = tokenizer(prompts, truncation=False, verbose=False).input_ids
    for prompt, ids in zip(prompts, full):
        if len(ids) > max_length:
            log.warning("%s keeps %d of the %d tokens of the prompt %.60r", name, max_length, len(ids), prompt)
    return enc.input_ids, enc.attention_mask


def _component(components: PipelineComponents, kind: str, name: str, family: str):
    table = components.text_encoders if kind == "encoder" else components.tokenizers
    if name not in table:
        raise ConfigError(
            f"{family} text encoding needs {name!r}, which is not loaded from {components.path}",
            f"{family} conditions on the outputs of all of its text encoders",
            'load the pipeline with parts including "text" (and keep its tokenizer folders)',
        )
    return table[name]


def _clip(components: PipelineComponents, index: str, prompts: list[str], max_length: int, family: str):
    """(output of CLIP encoder ``text_encoder{index}``, its dtype) with hidden states."""
    encoder = _component(components, "encoder", f"text_encoder{index}", family)
    tokenizer = _component(components, "tokenizer", f"tokenizer{index}", family)
    ids, _ = _tokenize(tokenizer, prompts, max_length, f"text_encoder{index} (CLIP)")
    return encoder(ids.to(_device_of(encoder)), output_hidden_states=True), _dtype_of(encoder)


def _t5(components: PipelineComponents, index: str, prompts: list[str], max_length: int, family: str, masked: bool):
    """(T5 last hidden state in the encoder's dtype, attention mask)."""
    encoder = _component(components, "encoder", f"text_encoder{index}", family)
    tokenizer = _component(components, "tokenizer", f"tokenizer{index}", family)
    ids, mask = _tokenize(tokenizer, prompts, max_length, f"text_encoder{index} (T5)")
    dev = _device_of(encoder)
    out = encoder(ids.to(dev), attention_mask=mask.to(dev) if masked else None)[0]
    return out.to(_dtype_of(encoder)), mask


def _encode_flux(comps: PipelineComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    clip_length = comps.tokenizers["tokenizer"].model_max_length if "tokenizer" in comps.tokenizers else 77
    clip_out, clip_dtype = _clip(comps, "", prompts, clip_length, "flux")
    tokens, _ = _t5(comps, "_2", prompts, t5_length, "flux", masked=False)
    return Conditioning(tokens.to(device), clip_out.pooler_output.to(device=device, dtype=clip_dtype))


def _encode_sd3(comps: PipelineComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    clip_length = comps.tokenizers["tokenizer"].model_max_length if "tokenizer" in comps.tokenizers else 77
    hidden, pooled = [], []
    clip_dtype = None
    for index in ("", "_2"):
        out, dtype = _clip(comps, index, prompts, clip_length, "sd3")
        clip_dtype = clip_dtype or dtype  # diffusers casts both CLIP outputs to text_encoder's dtype
        hidden.append(out.hidden_states[-2].to(device=device, dtype=clip_dtype))
        pooled.append(out[0].to(device))
    clip_tokens = torch.cat(hidden, dim=-1)
    if "text_encoder_3" in comps.text_encoders:
        t5_tokens = _t5(comps, "_3", prompts, t5_length, "sd3", masked=False)[0].to(device)
    else:  # SD3 without T5: diffusers uses zeros of the transformer's joint width
        width = comps.transformer_config["joint_attention_dim"]
        t5_tokens = torch.zeros(len(prompts), t5_length, width, device=device, dtype=clip_dtype)
    clip_tokens = nn.functional.pad(clip_tokens, (0, t5_tokens.shape[-1] - clip_tokens.shape[-1]))
    return Conditioning(torch.cat([clip_tokens, t5_tokens], dim=-2), torch.cat(pooled, dim=-1))


def _encode_pixart(comps: PipelineComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    prompts = [p.lower().strip() for p in prompts]
    tokens, mask = _t5(comps, "", prompts, t5_length, "pixart", masked=True)
    return Conditioning(tokens.to(device), None, mask.to(device))


def _encode_qwen_image(
    comps: PipelineComponents, prompts: list[str], length: int, device: torch.device
) -> Conditioning:
    from .text_big import encode_qwen_image

    encoder = _component(comps, "encoder", "text_encoder", "qwen-image")
    tokenizer = _component(comps, "tokenizer", "tokenizer", "qwen-image")
    return encode_qwen_image(encoder, tokenizer, prompts, length).to(device)


def _encode_flux2(comps: PipelineComponents, prompts: list[str], length: int, device: torch.device) -> Conditioning:
    from .text_big import encode_flux2

    encoder = _component(comps, "encoder", "text_encoder", "flux2")
    tokenizer = _component(comps, "tokenizer", "tokenizer", "flux2")
    return encode_flux2(encoder, tokenizer, prompts, length).to(device)


def clean_wan_prompt(text: str) -> str:
    """The Wan pipelines' prompt_clean: ftfy's fix_text (when installed), HTML entities unescaped twice,
    runs of whitespace as one space, stripped."""
    try:
        import ftfy
    except ImportError:  # diffusers skips it too when it is missing
        ftfy = None
    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def _encode_wan(comps: PipelineComponents, prompts: list[str], t5_length: int, device: torch.device) -> Conditioning:
    prompts = [clean_wan_prompt(p) for p in prompts]
    tokens, mask = _t5(comps, "", prompts, t5_length, "wan", masked=True)
    keep = mask.to(tokens.device).gt(0).unsqueeze(-1)  # the states past each prompt's tokens are zeros
    return Conditioning(torch.where(keep, tokens, torch.zeros_like(tokens)).to(device))


_FAMILIES = {
    "flux": _encode_flux,
    "sd3": _encode_sd3,
    "pixart": _encode_pixart,
    "qwen-image": _encode_qwen_image,
    "flux2": _encode_flux2,
    "wan": _encode_wan,
}


def default_max_sequence_length(components: PipelineComponents, family: str) -> int:
    """T5 token count the family's diffusers pipeline uses by default."""
    if family == "pixart" and components.pipeline_class == "PixArtSigmaPipeline":
        return PIXART_SIGMA_LENGTH
    return T5_LENGTH[family]


@torch.no_grad()
def encode_prompt(
    components: PipelineComponents,
    family: str,
    prompt: str | Sequence[str],
    max_sequence_length: int | None = None,
    device: torch.device | str | None = None,
) -> Conditioning:
    """Encode ``prompt`` (one string or a batch) into the family's Conditioning.

    ``device`` defaults to the device of the first text encoder."""
    if family not in _FAMILIES:
        raise ConfigError(
            f"unknown model family {family!r} for text encoding",
            "each family combines its text encoders differently",
            f"use one of: {', '.join(_FAMILIES)}",
        )
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not components.text_encoders:
        _component(components, "encoder", "text_encoder", family)  # raises the 'not loaded' error
    if device is None:
        device = _device_of(next(iter(components.text_encoders.values())))
    length = max_sequence_length or default_max_sequence_length(components, family)
    return _FAMILIES[family](components, prompts, length, torch.device(device))


def encode_prompts(
    components: PipelineComponents,
    family: str,
    prompt: str | Sequence[str],
    negative_prompt: str | Sequence[str] = "",
    max_sequence_length: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Conditioning, Conditioning]:
    """(positive, negative) conditioning; a string negative is repeated for every prompt."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    negatives = [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else list(negative_prompt)
    if len(negatives) != len(prompts):
        raise ConfigError(
            f"{len(negatives)} negative prompts for {len(prompts)} prompts",
            "each prompt's negative forms its classifier-free-guidance pair",
            "pass one negative string, or a list as long as the prompt list",
        )
    pos = encode_prompt(components, family, prompts, max_sequence_length, device)
    neg = encode_prompt(components, family, negatives, max_sequence_length, device)
    return pos, neg
