"""CLIP-L's text tower read from ONE file, as ComfyUI keeps it in ``models/text_encoders`` (``clip_l.safetensors``):
transformers' ``CLIPTextModel`` names (``text_model.*``; ``text_projection`` / ``logit_scale`` are not used).

The sizes come from the header (width, layers, feed-forward, vocabulary, positions); the heads are CLIP-L's 64 wide
(ViT-L/14's text tower: 768 wide, 12 heads, quick-GELU, LayerNorm eps 1e-5, as ComfyUI's clip_l config states).
ComfyUI holds the weights in float16 (its text-encoder dtype) and computes in float32; so does this module.

The pooled output is CLIP's final-norm state at the first end token of a prompt's FIRST 77-token chunk (ComfyUI
splits longer prompts into chunks: the start token, up to 75 tokens, the end token, padded with the end token;
a weighted run of text shorter than 8 tokens that does not fit moves whole to the next chunk, a longer one is cut).
Prompt weights do not change it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError

HEAD_DIM = 64  # CLIP-L's attention heads (768 / 12)
KEEP_WHOLE_BELOW = 8  # ComfyUI keeps a run of fewer tokens in one chunk (its max_word_length)
LAYER = re.compile(r"text_model\.encoder\.layers\.(\d+)\.mlp\.fc1\.weight")
TOKENS = "text_model.embeddings.token_embedding.weight"
POSITIONS = "text_model.embeddings.position_embedding.weight"
CLIP_G_WIDTH = 1280


def _shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    from .t5_text_file import safetensors_shapes

    return safetensors_shapes(path)


def is_clip_text_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a .safetensors file of a CLIP text tower (header only)."""
    if not str(path).lower().endswith(".safetensors"):
        return False
    try:
        return TOKENS in _shapes(path)
    except (OSError, ValueError, ConfigError):
        return False


def clip_l_config(shapes: dict[str, tuple[int, ...]], name: str, what: str):
    """transformers' ``CLIPTextConfig`` of the CLIP-L text tower whose tensors have ``shapes``."""
    from transformers import CLIPTextConfig

    layers = [int(m.group(1)) for k in shapes if (m := LAYER.fullmatch(k))]
    if TOKENS not in shapes or POSITIONS not in shapes or not layers:
        raise ConfigError(
            f"{name} is not a CLIP text encoder",
            f"{what} is read from transformers' CLIP layout (text_model.embeddings..., text_model.encoder.layers...)",
            "pick clip_l.safetensors (ComfyUI's models/text_encoders)",
        )
    vocab, width = shapes[TOKENS]
    if width == CLIP_G_WIDTH or width % HEAD_DIM:
        raise ConfigError(
            f"{name} is a CLIP text encoder {width} wide"
            + (" (CLIP-G, SDXL's / SD3's second CLIP)" * (width == CLIP_G_WIDTH)),
            f"{what} is CLIP-L (768 wide, heads of {HEAD_DIM})",
            "pick clip_l.safetensors",
        )
    return CLIPTextConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=shapes["text_model.encoder.layers.0.mlp.fc1.weight"][0],
        num_hidden_layers=max(layers) + 1,
        num_attention_heads=width // HEAD_DIM,
        max_position_embeddings=shapes[POSITIONS][0],
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
        # ids within the vocabulary for transformers' own pooler, which is not used: the pooled output is read
        # here, at the tokenizer's end token
        bos_token_id=None,
        eos_token_id=vocab - 1,
        pad_token_id=None,
    )


def check_clip_l_file(path: str, what: str = "CLIP-L") -> None:
    """On the host: ``path`` is a CLIP-L text tower in a .safetensors file (a ConfigError saying why not)."""
    name = Path(path).name
    if not name.lower().endswith(".safetensors"):
        raise ConfigError(
            f"{name} as the {what} file",
            f"{what} is read from a .safetensors file in transformers' CLIP layout (GGUF CLIP files are not read, "
            "as ComfyUI-GGUF's CLIP loaders read none: their GGUFs are llama.cpp's T5 / Llama / Qwen text models)",
            "pick clip_l.safetensors (ComfyUI's models/text_encoders)",
        )
    clip_l_config(_shapes(path), name, what)


def load_clip_l_file(path: str | os.PathLike, device: str | torch.device = "cpu", what: str = "CLIP-L") -> nn.Module:
    """The CLIP-L text tower of ``path`` on ``device``: weights rounded to float16 as ComfyUI holds them, kept in
    float32 (its compute dtype)."""
    from transformers import CLIPTextModel

    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    shapes = {k: e.shape for k, e in file.entries.items()}
    config = clip_l_config(shapes, file.path.name, what)
    with torch.device("meta"):
        model = CLIPTextModel(config)
    # the file's names are text_model.*; transformers' CLIPTextModel may name its parameters without the prefix
    key = {n: n if n in shapes else f"text_model.{n}" for n, _ in model.named_parameters()}
    with file:
        state = {n: file.read(k).to(torch.float16).to(torch.float32) for n, k in key.items() if k in shapes}
    missing = sorted(k for n, k in key.items() if n not in state)
    if missing:
        raise ConfigError(
            f"{file.path.name} lacks {len(missing)} tensors of the {what} text tower (e.g. {missing[0]})",
            "a CLIP-L file holds every text_model.* tensor of CLIP's text tower",
            "pick a complete clip_l.safetensors",
        )
    model.load_state_dict(state, strict=False, assign=True)
    embeddings = getattr(model, "text_model", model).embeddings
    positions = torch.arange(config.max_position_embeddings)[None]
    embeddings.register_buffer("position_ids", positions, persistent=False)
    return model.to(device).eval().requires_grad_(False)


def first_chunk(runs: list[list[int]], start: int, end: int, length: int) -> list[int]:
    """The tokens of a prompt's first ``length``-token chunk up to its end token (see the module doc), from the
    token runs of its weighted pieces of text."""
    chunk = [start]
    for run in runs:
        room = length - 1 - len(chunk)
        if len(run) <= room:
            chunk += run
            continue
        if len(run) >= KEEP_WHOLE_BELOW:
            chunk += run[:room]
        break
    return chunk + [end]


@torch.no_grad()
def clip_pooled(encoder: nn.Module, tokenizer, prompt: str) -> torch.Tensor:
    """CLIP's pooled output [1, width] of ``prompt`` (float32), as ComfyUI's CLIP-L gives it."""
    from .prompt_weights import weighted_segments

    start, end = tokenizer("").input_ids[:2]
    ids_of: Callable[[str], list[int]] = lambda text: list(tokenizer(text, truncation=False).input_ids[1:-1])  # noqa: E731
    length = encoder.config.max_position_embeddings
    chunk = first_chunk([ids_of(run) for run, _ in weighted_segments(prompt)], start, end, length)
    device = next(encoder.parameters()).device
    ids = torch.tensor([chunk + [end] * (length - len(chunk))], device=device)
    states = encoder(input_ids=ids).last_hidden_state
    return states[:, len(chunk) - 1].float()
