"""HunyuanVideo 1.0 prompts, as HunyuanVideoPipeline encodes them: the prompt inside Hunyuan's video template,
through the Llama (LLaVA-Llama-3) text encoder; the hidden states of its third-last layer from the end of the
template's header on (``crop``), up to 256 prompt tokens -> tokens; CLIP-L's pooled output (77 tokens) -> pooled.

The pipeline pads every prompt to 256 tokens and masks the padding; here the tokens are cut to those some prompt
of the batch keeps (one prompt: exactly its own, as ComfyUI's HunyuanVideo text encoder gives them), and the mask
is kept only when the prompts' lengths differ. The transformer's result is the same either way (see adapter.py).
"""

from __future__ import annotations

import torch

from ...base import Conditioning
from ...text_parts import TextComponents, clip, component, device_of, dtype_of, tokenize
from ..spec import TextEncoding
from . import ID

TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following aspects: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
)  # HunyuanVideoPipeline's DEFAULT_PROMPT_TEMPLATE (the model's own)
SKIPPED_LAYERS = 2  # the pipeline reads hidden_states[-(2 + 1)]


def template_crop(tokenizer) -> int:
    """Template tokens before the prompt: those of the text up to the prompt (95 with the released Llama-3
    tokenizer, the pipeline's ``crop_start``)."""
    return len(tokenizer(TEMPLATE.split("{}")[0]).input_ids)


def llama_states(comps: TextComponents, prompts: list[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states [B, max_length, D] after the template, their mask [B, max_length])."""
    encoder = component(comps, "encoder", "text_encoder", ID)
    tokenizer = component(comps, "tokenizer", "tokenizer", ID)
    crop = template_crop(tokenizer)
    ids, mask = tokenize(tokenizer, [TEMPLATE.format(p) for p in prompts], max_length + crop, "text_encoder (Llama)")
    dev = device_of(encoder)
    out = encoder(input_ids=ids.to(dev), attention_mask=mask.to(dev), output_hidden_states=True)
    states = out.hidden_states[-(SKIPPED_LAYERS + 1)].to(dtype_of(encoder))
    return states[:, crop:], mask[:, crop:]


def encode(comps: TextComponents, prompts: list[str], max_length: int, device: torch.device) -> Conditioning:
    states, mask = llama_states(comps, prompts, max_length)
    kept = mask.bool().any(dim=0).nonzero().flatten().to(states.device)  # right padding: a prefix
    states, mask = states[:, kept], mask[:, kept.cpu()]
    clip_tokens = component(comps, "tokenizer", "tokenizer_2", ID).model_max_length  # 77
    clip_out, clip_dtype = clip(comps, "_2", prompts, clip_tokens, ID)
    pooled = clip_out.pooler_output.to(device=device, dtype=clip_dtype)
    return Conditioning(states.to(device), pooled, None if bool(mask.all()) else mask.to(device))


ENCODING = TextEncoding(encode)
