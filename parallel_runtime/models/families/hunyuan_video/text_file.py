"""HunyuanVideo 1.0's text encoders from TWO files, as ComfyUI's DualCLIPLoader (type "hunyuan_video") reads them
from ``models/text_encoders``: LLaVA-Llama-3 (``llava_llama3_fp16.safetensors``, ``llava_llama3_fp8_scaled.safetensors``:
Hugging Face's Llama names under ``model.``; the vision tower is another file; or a llama.cpp GGUF) and CLIP-L (``clip_l.safetensors``;
read by ``models.clip_text_file``). The Llama tokenizer is a folder (ComfyUI's ``llama_tokenizer``).

A prompt is encoded as ComfyUI does it for HunyuanVideo (facts of its encoder, checked against it):

- Llama: the prompt inside the video template (``text.TEMPLATE``, the model's own), ComfyUI's ``(word:1.2)``
  weights read over the whole text, each weighted run tokenized alone without its start token; the start token in
  front, no end token, no padding (one prompt: no mask). The states are those of the third-last layer (no final
  norm), computed in the model's dtype; weighted tokens move from the states of the empty row (the start token,
  then Llama-3's pad id 128258, the mask over the start token only).
- The template is cut away by Llama-3's token ids: the states kept start after the LAST
  ``<|start_header_id|> user <|end_header_id|>`` (at the end-of-header token itself, or two tokens on when
  "\\n\\n" follows it) and end with the first ``<|eot_id|>`` after it (included). So a prompt gives its tokens and
  the end-of-turn token (the empty prompt: that token alone); HunyuanVideoPipeline pads to 256 tokens and masks
  the padding instead, which the transformer reads the same way (``text.py``).
- CLIP-L: its pooled output, not projected (see ``clip_text_file``).

With an image (ComfyUI's TextEncodeHunyuanVideo_ImageToVideo: a CLIP_VISION_OUTPUT's ``mm_projected``, LLaVA's
vision tokens already in Llama's width) the template is HunyuanVideo-I2V's (``I2V_TEMPLATE``): its ``<image>``
token (id 128257) becomes the image's vision tokens, the prompt's states are cut as above (positions counted with
the vision tokens in), and every ``image_interleave``-th vision token's states go in front of them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...clip_text_file import check_clip_l_file, clip_pooled, is_clip_text_file, load_clip_l_file
from ...prefixed_text_file import decoder_config, load_prefixed_model
from ..spec import SecondEncoderFile, TextEncoderFile
from .text import SKIPPED_LAYERS, TEMPLATE

I2V_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\n<image>\nDescribe the video by detailing the following aspects "
    "according to the reference image: "
    "1. The main content and theme of the video."
    "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects."
    "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects."
    "4. background environment, light, style and atmosphere."
    "5. camera angles, movements, and transitions used in the video:<|eot_id|>\n\n"
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)  # HunyuanVideoImageToVideoPipeline's DEFAULT_PROMPT_TEMPLATE (the I2V model's own)

WHAT = "LLaVA-Llama-3 (HunyuanVideo's text encoder)"
CLIP_WHAT = "CLIP-L (HunyuanVideo's second text encoder)"
TEXT_PREFIX = "model."
LLAMA3_8B: Mapping[str, Any] = {  # llava-llama-3-8b's text config: what the weights do not show
    "head_dim": 128,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
}
# Llama-3's token ids that locate the prompt in the template, and the id its empty rows are padded with
HEADER_START, USER, HEADER_END, NEWLINES, EOT, PAD = 128006, 882, 128007, 271, 128009, 128258
IMAGE = 128257  # Llama-3 LLaVA's <image>


def _shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    from ...tensor_files import SafetensorsFile

    return {k: e.shape for k, e in SafetensorsFile(Path(path).expanduser()).entries.items()}


def llama_text_config(shapes: Mapping[str, tuple[int, ...]], overrides: Mapping[str, Any] | None = None) -> dict:
    """The Llama config of a ComfyUI text-encoder file, from its header (``overrides``: e.g. a head width)."""
    base = {**LLAMA3_8B, **(overrides or {})}
    layer = TEXT_PREFIX + "layers.0."
    llama = TEXT_PREFIX + "embed_tokens.weight" in shapes and layer + "post_attention_layernorm.weight" in shapes
    if not llama or layer + "self_attn.k_proj.bias" in shapes or layer + "self_attn.q_norm.weight" in shapes:
        raise ConfigError(
            "the file does not hold a Llama text model (model.embed_tokens, model.layers.0 without Qwen's k_proj "
            "bias or q_norm)",
            "HunyuanVideo 1.0's text encoder is LLaVA-Llama-3 8B, stored by ComfyUI under 'model.'",
            "pick llava_llama3_fp16.safetensors / llava_llama3_fp8_scaled.safetensors from models/text_encoders",
        )
    layers = len({k.split(".")[2] for k in shapes if k.startswith(TEXT_PREFIX + "layers.")})
    config = decoder_config(shapes, TEXT_PREFIX, base["head_dim"], layers, base)
    return {**config, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}


def load_llama3_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The Llama text model in ComfyUI's ``path`` (see the module doc), on ``device`` in ``dtype`` (fp8 layers as
    stored, with their scales)."""
    from transformers import LlamaConfig, LlamaModel

    if str(path).lower().endswith(".gguf"):
        return _load_llama3_gguf(path, device, dtype, storage, overrides)

    def build(shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
        return LlamaModel(LlamaConfig(**llama_text_config(shapes, overrides)))

    return load_prefixed_model(path, TEXT_PREFIX, build, device, dtype, storage, only_model_parameters=True)


def _load_llama3_gguf(path, device, dtype: torch.dtype, storage: str, overrides) -> nn.Module:
    """The Llama text model of a llama.cpp GGUF (general.architecture "llama", e.g.
    ``llava-llama-3-8b-v1_1-Q4_K_M.gguf``, as ComfyUI-GGUF's DualCLIPLoaderGGUF reads it): Linear weights kept in
    their GGML blocks, query / key rows put back in transformers' order by the file's head counts, the head width,
    RoPE base and norm epsilon from its ``llama.*`` metadata (``models.gguf.llama_text``)."""
    from ...gguf.llama_text import load_llama_gguf

    return load_llama_gguf(path, TEXT_PREFIX, WHAT, llama_text_config, device, dtype, storage, overrides)


def check_llama3_file(path: str) -> None:
    """On the host, before any worker reads it: the file holds a Llama text model (a GGUF: of architecture
    llama)."""
    from ...gguf.llama_text import open_llama_gguf

    gguf = str(path).lower().endswith(".gguf")
    llama_text_config(open_llama_gguf(path, TEXT_PREFIX, WHAT)[1] if gguf else _shapes(path))


def prompt_span(ids: Sequence[int]) -> tuple[int, int]:
    """[first, end) of the prompt's states among a templated row's token ``ids`` (see the module doc)."""
    first, end = 0, len(ids)
    open_turn = False
    for i, token in enumerate(ids):
        if token == HEADER_START and ids[i + 1 : i + 3] == [USER, HEADER_END]:
            first, end, open_turn = i + 2, len(ids) - 1, True
        elif token == EOT and open_turn:
            end, open_turn = i + 1, False
    if len(ids) > first + 2 and ids[first + 1] == NEWLINES:
        first += 2
    return first, end


@torch.no_grad()
def llama_prompt_states(
    encoder: nn.Module, tokenizer, prompt: str, images: torch.Tensor | None = None, interleave: int = 1
) -> torch.Tensor:
    """The Llama states [1, N, D] (float32) ComfyUI keeps of ``prompt`` (see the module doc); ``images``
    [I, tokens, D]: vision tokens in the image-to-video template, every ``interleave``-th kept in front."""
    from ...prompt_weights import apply_weights, weighted_segments

    start = tokenizer("").input_ids[0]
    ids, weights = [start], [1.0]
    for run, weight in weighted_segments((TEMPLATE if images is None else I2V_TEMPLATE).format(prompt)):
        tokens = list(tokenizer(run, truncation=False).input_ids[1:])
        ids += tokens
        weights += [weight] * len(tokens)
    device = next(encoder.parameters()).device
    first, end = prompt_span(ids)
    if images is not None:
        if any(w != 1.0 for w in weights):
            raise ConfigError(
                "a weighted prompt ('(word:1.2)') with an image's vision tokens",
                "ComfyUI's weights move states toward an empty row of the same tokens, which the vision tokens lack",
                "write the image-to-video prompt without weights",
            )
        return _with_images(encoder, ids, images.to(device), interleave, first, end)

    def run(row: list[int], mask: torch.Tensor) -> torch.Tensor:
        out = encoder(
            input_ids=torch.tensor([row], device=device), attention_mask=mask.to(device), output_hidden_states=True
        )
        return out.hidden_states[-(SKIPPED_LAYERS + 1)].float()

    states = run(ids, torch.ones(1, len(ids), dtype=torch.long))
    if any(w != 1.0 for w in weights):
        empty_mask = (torch.arange(len(ids)) < 1).long()[None]
        states = apply_weights(states, run([start] + [PAD] * (len(ids) - 1), empty_mask), [weights])
    return states[:, first:end]


def _with_images(
    encoder: nn.Module, ids: list[int], images: torch.Tensor, interleave: int, first: int, end: int
) -> torch.Tensor:
    """The states of ``ids`` whose first ``<image>`` tokens (one per image) are the images' vision tokens: every
    ``interleave``-th state of the images before the prompt, then the prompt's [first, end) (token positions)."""
    table = encoder.get_input_embeddings()
    if images.ndim != 3 or images.shape[-1] != table.embedding_dim:
        raise ConfigError(
            f"image vision tokens of shape {tuple(images.shape)} for a Llama {table.embedding_dim} wide",
            "the image's LLaVA tokens (a CLIP_VISION_OUTPUT's mm_projected) take the place of Llama's <image> token",
            "encode the start image with CLIPVisionLoader's llava_llama3_vision.safetensors (CLIPVisionEncode)",
        )
    pieces, where, ahead, shift = [], [], [], 0  # where: token position -> position with the vision tokens in
    for i, token in enumerate(ids):
        where.append(i + shift)
        if token == IMAGE and len(pieces) < images.shape[0]:  # ComfyUI fills one <image> per image, in order
            image = images[len(pieces)]
            pieces.append((i, image))
            if i < first:
                ahead.append((i + shift, i + shift + image.shape[0]))
            shift += image.shape[0] - 1
    where.append(len(ids) + shift)
    embeds = table(torch.tensor([ids], device=images.device))
    rows, last = [], 0
    for i, image in pieces:
        rows += [embeds[:, last:i], image[None].to(embeds.dtype)]
        last = i + 1
    rows.append(embeds[:, last:])
    out = encoder(inputs_embeds=torch.cat(rows, dim=1), output_hidden_states=True)
    states = out.hidden_states[-(SKIPPED_LAYERS + 1)].float()
    kept = [states[:, a:b:interleave] for a, b in ahead]
    return torch.cat([*kept, states[:, where[first] : where[end]]], dim=1)


@torch.no_grad()
def encode_hunyuan_video_files(
    encoders, tokenizers, prompts: Sequence[str], max_sequence_length: int = 0, vision: Mapping | None = None
):
    """HunyuanVideo conditioning of ``prompts`` from (Llama, CLIP-L) ``encoders`` and their ``tokenizers``
    (``max_sequence_length`` is not used: ComfyUI keeps every prompt token). Prompts of different lengths are
    padded with zeros at the end and masked. ``vision``: {"states": [I, tokens, D] vision tokens, "interleave"}
    (TextEncodeHunyuanVideo_ImageToVideo's image and image_interleave)."""
    llama, clip = encoders
    llama_tokenizer, clip_tokenizer = tokenizers
    images, interleave = (None, 1) if vision is None else (vision["states"].float(), int(vision["interleave"]))
    rows = [llama_prompt_states(llama, llama_tokenizer, p, images, interleave) for p in prompts]
    length = max(r.shape[1] for r in rows)
    states = torch.cat([nn.functional.pad(r, (0, 0, 0, length - r.shape[1])) for r in rows])
    mask = torch.stack([(torch.arange(length) < r.shape[1]).long() for r in rows]).to(states.device)
    pooled = torch.cat([clip_pooled(clip, clip_tokenizer, p) for p in prompts]).to(states.device)
    return Conditioning(states, pooled, None if bool(mask.all()) else mask)


CLIP_L = SecondEncoderFile(
    "CLIP-L",
    lambda path, device: load_clip_l_file(path, device, CLIP_WHAT),
    lambda path: check_clip_l_file(path, CLIP_WHAT),
    is_clip_text_file,
)

ENCODER_FILE = TextEncoderFile(
    "LLaVA-Llama-3",
    load_llama3_file,
    encode_hunyuan_video_files,
    0,
    check=check_llama3_file,
    second=CLIP_L,
    takes_vision=True,
)
