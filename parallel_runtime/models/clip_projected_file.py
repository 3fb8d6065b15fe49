"""A CLIP text tower WITH its projection, read from ONE file as ComfyUI keeps it in ``models/text_encoders``:
CLIP-L (``clip_l*.safetensors``, 768 wide, quick-GELU) or CLIP-G (``clip_g*.safetensors``, OpenCLIP bigG's
text tower: 1280 wide, GELU), under transformers' ``CLIPTextModelWithProjection`` names (``text_model.*``,
``text_projection.weight``).

Sizes come from the header; heads are 64 wide in both (12 and 20 heads), LayerNorm eps 1e-5 (ComfyUI's clip_l
and clip_bigg configs). As ComfyUI: weights held in float16 (its text-encoder dtype), computed in float32. The
pooled output is the projected one: the final-norm state at the first end token of the prompt's first 77-token
chunk (``clip_text_file.clip_pooled``) through ``text_projection`` (ComfyUI's ``return_projected_pooled``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError
from .clip_text_file import HEAD_DIM, LAYER, POSITIONS, TOKENS, _shapes, clip_pooled

PROJECTION = "text_projection.weight"
ACTIVATION = {"CLIP-L": "quick_gelu", "CLIP-G": "gelu"}


def clip_width(path: str | os.PathLike) -> int | None:
    """The width of a .safetensors CLIP text tower with a projection (header only); None for other files."""
    if not str(path).lower().endswith(".safetensors"):
        return None
    try:
        shapes = _shapes(path)
    except (OSError, ValueError, ConfigError):
        return None
    return shapes[TOKENS][1] if TOKENS in shapes and PROJECTION in shapes else None


def projected_clip_config(shapes: dict[str, tuple[int, ...]], name: str, kind: str):
    """transformers' ``CLIPTextConfig`` of the ``kind`` ("CLIP-L" / "CLIP-G") tower whose tensors have ``shapes``."""
    from transformers import CLIPTextConfig

    layers = [int(m.group(1)) for k in shapes if (m := LAYER.fullmatch(k))]
    if TOKENS not in shapes or POSITIONS not in shapes or PROJECTION not in shapes or not layers:
        raise ConfigError(
            f"{name} is not a CLIP text encoder with its projection",
            f"{kind} is read from transformers' CLIP layout (text_model.embeddings..., text_model.encoder.layers..., "
            "text_projection.weight)",
            f"pick {kind.lower().replace('-', '_')}*.safetensors (ComfyUI's models/text_encoders)",
        )
    vocab, width = shapes[TOKENS]
    if width % HEAD_DIM:
        raise ConfigError(
            f"{name} is a CLIP text encoder {width} wide",
            f"{kind}'s attention heads are {HEAD_DIM} wide",
            f"pick {kind.lower().replace('-', '_')}*.safetensors",
        )
    return CLIPTextConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=shapes["text_model.encoder.layers.0.mlp.fc1.weight"][0],
        projection_dim=shapes[PROJECTION][0],
        num_hidden_layers=max(layers) + 1,
        num_attention_heads=width // HEAD_DIM,
        max_position_embeddings=shapes[POSITIONS][0],
        hidden_act=ACTIVATION[kind],
        layer_norm_eps=1e-5,
        bos_token_id=None,  # the pooled output is read at the tokenizer's end token, not transformers' pooler
        eos_token_id=vocab - 1,
        pad_token_id=None,
    )


def check_projected_clip_file(path: str, kind: str) -> None:
    """On the host: ``path`` is a ``kind`` CLIP text tower with its projection (a ConfigError saying why not)."""
    name = Path(path).name
    if not name.lower().endswith(".safetensors"):
        raise ConfigError(
            f"{name} as the {kind} file",
            f"{kind} is read from a .safetensors file in transformers' CLIP layout (GGUF CLIP files are not read, "
            "as ComfyUI-GGUF's CLIP loaders read none: their GGUFs are llama.cpp's T5 / Llama / Qwen text models)",
            f"pick {kind.lower().replace('-', '_')}*.safetensors (ComfyUI's models/text_encoders)",
        )
    projected_clip_config(_shapes(path), name, kind)


def load_projected_clip_file(path: str | os.PathLike, device: str | torch.device, kind: str) -> nn.Module:
    """The ``kind`` CLIP text tower of ``path`` with its projection, on ``device`` (float16-rounded weights kept
    in float32)."""
    from transformers import CLIPTextModelWithProjection

    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    shapes = {k: e.shape for k, e in file.entries.items()}
    config = projected_clip_config(shapes, file.path.name, kind)
    with torch.device("meta"):
        model = CLIPTextModelWithProjection(config)
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if n not in shapes]
    if missing:
        raise ConfigError(
            f"{file.path.name} lacks {len(missing)} tensors of the {kind} text tower (e.g. {missing[0]})",
            f"a {kind} file holds every text_model.* tensor of CLIP's text tower and text_projection.weight",
            f"pick a complete {kind.lower().replace('-', '_')}*.safetensors",
        )
    with file:
        state = {n: file.read(n).to(torch.float16).to(torch.float32) for n in names}
    model.load_state_dict(state, strict=False, assign=True)
    embeddings = model.text_model.embeddings
    embeddings.register_buffer("position_ids", torch.arange(config.max_position_embeddings)[None], persistent=False)
    return model.to(device).eval().requires_grad_(False)


@torch.no_grad()
def projected_pooled(encoder: nn.Module, tokenizer, prompt: str) -> torch.Tensor:
    """The projected pooled output [1, projection] of ``prompt`` (float32), as ComfyUI's CLIP with
    ``return_projected_pooled`` gives it."""
    return encoder.text_projection(clip_pooled(encoder, tokenizer, prompt)).float()
