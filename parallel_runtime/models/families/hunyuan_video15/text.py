"""HunyuanVideo 1.5 prompts, as HunyuanVideo15Pipeline encodes them:

- the prompt as the user turn of a chat after Hunyuan's video system message (Qwen2.5-VL's chat template, with
  the assistant's turn opened), through Qwen2.5-VL's text model; the hidden states of its third-last layer from
  the end of the template's header on, up to 1000 prompt tokens -> tokens;
- the prompt's quoted text ("..." or “...”), each distinct one once, as ``Text "<quote>". `` joined, through
  ByT5 (256 tokens) -> the glyph states (``GlyphText``); none without quotes.

As for HunyuanVideo 1.0 the padding is cut to the tokens some prompt keeps (masks kept only for prompts of
different lengths).
"""

from __future__ import annotations

import re

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, component, device_of, dtype_of
from ..hunyuan_video.adapter import kept_text
from ..spec import TextEncoding
from . import ID
from .conditioning import GlyphText

_GAP = " " * 9  # the pipeline's message keeps its source's line indentation after each point
SYSTEM = _GAP.join(
    (
        "You are a helpful assistant. Describe the video by detailing the following aspects:",
        "1. The main content and theme of the video.",
        "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.",
        "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.",
        "4. background environment, light, style and atmosphere.",
        "5. camera angles, movements, and transitions used in the video.",
    )
)
SKIPPED_LAYERS = 2
GLYPH_TOKENS = 256
_QUOTED = re.compile(r"\"(.*?)\"|“(.*?)”")


def _chat(prompts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": p or " "}] for p in prompts]


def template_crop(tokenizer) -> int:
    """Chat-template tokens before the prompt (108 with the released Qwen2.5-VL tokenizer, the pipeline's
    ``prompt_template_encode_start_idx``)."""
    mark = "\x00PROMPT\x00"
    chat = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": mark}]]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)[0]
    return len(tokenizer(text.split(mark)[0], add_special_tokens=False).input_ids)


def glyph_prompt(prompt: str) -> str | None:
    """The ByT5 input of ``prompt``'s quoted text (None without quotes)."""
    quotes = [a or b for a, b in _QUOTED.findall(prompt)]
    if len(quotes) > 1:
        quotes = list(dict.fromkeys(quotes))
    return "".join(f'Text "{q}". ' for q in quotes) if quotes else None


def mllm_states(comps: TextComponents, prompts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    encoder = component(comps, "encoder", "text_encoder", ID)
    tokenizer = component(comps, "tokenizer", "tokenizer", ID)
    crop = template_crop(tokenizer)
    ids = tokenizer.apply_chat_template(
        _chat(prompts),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        padding="max_length",
        max_length=max_length + crop,
        truncation=True,
        return_tensors="pt",
    )
    dev = device_of(encoder)
    out = encoder(input_ids=ids.input_ids.to(dev), attention_mask=ids.attention_mask.to(dev), output_hidden_states=True)
    states = out.hidden_states[-(SKIPPED_LAYERS + 1)].to(dtype_of(encoder))
    return states[:, crop:], ids.attention_mask[:, crop:]


def glyph_states(comps: TextComponents, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    encoder = component(comps, "encoder", "text_encoder_2", ID)
    tokenizer = component(comps, "tokenizer", "tokenizer_2", ID)
    dev, dtype = device_of(encoder), dtype_of(encoder)
    states, masks = [], []
    for prompt in prompts:
        glyph = glyph_prompt(prompt)
        if glyph is None:
            states.append(torch.zeros(1, GLYPH_TOKENS, encoder.config.d_model, dtype=dtype, device=dev))
            masks.append(torch.zeros(1, GLYPH_TOKENS, dtype=torch.int64))
            continue
        tokens = tokenizer(glyph, padding="max_length", max_length=GLYPH_TOKENS, truncation=True, return_tensors="pt")
        out = encoder(input_ids=tokens.input_ids.to(dev), attention_mask=tokens.attention_mask.float().to(dev))[0]
        states.append(out.to(dtype))
        masks.append(tokens.attention_mask)
    return torch.cat(states), torch.cat(masks)


def encode(comps: TextComponents, prompts: list[str], max_length: int, device: torch.device) -> Conditioning:
    states, mask = mllm_states(comps, prompts, max_length)
    states, keep = kept_text(states, mask)
    glyph, glyph_mask = glyph_states(comps, prompts)
    if bool(glyph_mask.any()):
        glyph, glyph_keep = kept_text(glyph, glyph_mask.to(glyph.device))
    else:
        glyph, glyph_keep = glyph[:, :0], None
    extras = GlyphText(glyph.to(device), None if glyph_keep is None else glyph_keep.to(device))
    return Conditioning(states.to(device), None, None if keep is None else keep.to(device), extras)


ENCODING = TextEncoding(encode)
