"""A T5 / UMT5 text encoder read from ONE file, as ComfyUI keeps them in ``models/text_encoders``
(``t5xxl_fp16.safetensors``, ``umt5_xxl_fp16.safetensors``, ``umt5_xxl_fp8_e4m3fn_scaled.safetensors``).

The files hold the encoder under the original checkpoints' names (``shared.weight``, ``encoder.block.N...``,
``encoder.final_layer_norm.weight``); the sizes come from the header, so any width loads. fp8 files keep
their Linear layers in fp8 (``fp8.Fp8Linear``), "fp8 scaled" ones with their per-layer scales, as ComfyUI
holds them. Tensors that are not the encoder's (a tokenizer stored in the file, the fp8 marker) are left to
the family that reads them. Families combine this with their tokenizer and prompt rules (``families/<f>/``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .base import Conditioning
from .t5_encoder import T5Sizes, T5TextEncoder
from .t5_layout import t5_sizes
from .weights import TensorSource, load_tensors, parameters_on_meta


def safetensors_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Name -> shape of a .safetensors file (header only)."""
    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    return {k: e.shape for k, e in file.entries.items()}


def load_t5_safetensors(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    what: str = "T5",
) -> nn.Module:
    """The T5 / UMT5 encoder of a .safetensors file (see the module doc), on ``device``, weights in ``dtype``
    (fp8 ones as stored, with their scales)."""
    from .fp8 import detect_quantisation
    from .tensor_files import SafetensorsFile

    file = SafetensorsFile(Path(path).expanduser())
    with file:
        quant = detect_quantisation(file.header, file.read)
        scale_of = {w: file.read(s).to(torch.float32).reshape(()) for w, s in quant.scales.items()}
    shapes = {k: e.shape for k, e in file.entries.items()}
    with parameters_on_meta():
        model = T5TextEncoder(t5_sizes(shapes, file.path.name, what))
    params = {n for n, _ in model.named_parameters()}
    names = {k: k for k in shapes if k in params and k not in quant.extra_keys}

    def read(wanted: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        with file:
            for name in wanted:
                yield name, quant.stored(names[name], file.read(names[name]))

    source = TensorSource(
        file.path.name,
        {n: int(torch.Size(shapes[k]).numel()) for n, k in names.items()},
        read,
        fp8={n: quant.fp8_weights[k] for n, k in names.items() if k in quant.fp8_weights},
        scales={n: scale_of[k] for n, k in names.items() if k in scale_of},
        owned=True,
        shapes={n: tuple(shapes[k]) for n, k in names.items()},
        round_linear_to=quant.layer_dtype,
    )
    load_tensors(model, source, lambda name: "all", device, dtype, what=f"of the {what} encoder", storage=storage)
    return model.eval().requires_grad_(False)


def load_t5_text_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
    what: str = "T5",
) -> nn.Module:
    """The T5 / UMT5 encoder of ``path`` (.safetensors; ``overrides`` is unused: the file shows every size)."""
    if str(path).lower().endswith(".gguf"):
        from .gguf.t5_file import load_t5_gguf

        return load_t5_gguf(Path(path).expanduser(), device, dtype, storage, what)
    return load_t5_safetensors(path, device, dtype, storage, what)


END, PAD = 1, 0  # T5's end and padding token ids


def padded_tokens(rows: list[list[int]], min_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) [B, L] of token rows that already end with END: padded with PAD to max(min_length, longest)
    (a longer prompt is kept whole); mask 1 over each row's tokens."""
    length = max(min_length, *(len(r) for r in rows))
    ids = torch.full((len(rows), length), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def folder_tokenizer_ids(tokenizer) -> Callable[[str], list[int]]:
    """A run of text -> its T5 tokens without the end token, from a tokenizer folder's tokenizer (e.g. ComfyUI's
    ``t5_tokenizer``; no truncation)."""

    def ids_of(text: str) -> list[int]:
        ids = list(tokenizer(text, truncation=False).input_ids)
        return ids[:-1] if ids and ids[-1] == END else ids

    return ids_of


@torch.no_grad()
def encode_weighted(
    encoder: nn.Module,
    ids_of: Callable[[str], list[int]],
    prompts: Sequence[str],
    min_length: int,
    masked: bool,
    empty_row: Callable[[int], list[int]],
    zero_padding: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(states [B, L, D], mask [B, L]) of ``prompts`` in ComfyUI's weight syntax (``prompt_weights``): tokens + END
    padded to ``min_length``; ``masked``: the encoder sees the mask, and with ``zero_padding`` the padding's states
    are zeroed; ``empty_row(L)``: the empty prompt's tokens weighted tokens are measured from (a family's rule)."""
    from .prompt_weights import apply_weights, weighted_tokens

    rows, weights = zip(*(weighted_tokens(p, ids_of, END) for p in prompts))
    ids, mask = padded_tokens(list(rows), min_length)

    def run(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not masked:
            return encoder(ids)
        states = encoder(ids, mask)
        return states * mask.to(states.device, states.dtype).unsqueeze(-1) if zero_padding else states

    states = run(ids, mask)
    if any(w != 1.0 for row in weights for w in row):
        empty = torch.tensor([empty_row(ids.shape[1])])
        states = apply_weights(states, run(empty, (torch.arange(empty.shape[1]) < 1).long()[None]), list(weights))
    return states, mask


@torch.no_grad()
def encode_unpadded(
    encoder: nn.Module, tokenizer, prompts: Sequence[str], max_sequence_length: int = 1
) -> Conditioning:
    """T5 conditioning as ComfyUI's PixArt T5 rule reads a prompt (its CLIPLoader types pixart and chroma): the
    prompt's tokens and END, padded only to ``max_sequence_length`` (1 = none), the encoder run without a mask, no
    pooled output; weighted tokens measured from an empty prompt of padding only (no END). The mask is kept only
    when rows were padded (prompts of different lengths)."""
    states, mask = encode_weighted(encoder, folder_tokenizer_ids(tokenizer), prompts, max_sequence_length, False, _pads)
    return Conditioning(states, None, None if bool(mask.all()) else mask.to(states.device))


def _pads(length: int) -> list[int]:
    return [PAD] * length


def file_t5_sizes(path: str | os.PathLike, what: str = "T5") -> T5Sizes:
    """The encoder sizes of a .safetensors or .gguf T5 / UMT5 file (headers only; a ConfigError when it is not
    one)."""
    if str(path).lower().endswith(".gguf"):
        from .gguf.reader import GGUFFile
        from .gguf.t5_file import T5_ARCHITECTURES, t5_gguf_shapes
        from .gguf.text_model import check_text_architecture

        file = GGUFFile(Path(path).expanduser())
        check_text_architecture(file, T5_ARCHITECTURES, what)
        return t5_sizes(t5_gguf_shapes(file)[1], file.path.name, what)
    return t5_sizes(safetensors_shapes(path), Path(path).name, what)


def check_t5xxl_file(path: str, what: str) -> None:
    """On the host: ``path`` holds a T5 v1.1 encoder (T5-XXL's kind: one position table), not UMT5."""
    if file_t5_sizes(path, what).bias_per_block:
        raise ConfigError(
            f"{Path(path).name} is a UMT5 encoder (a position table in every block)",
            f"{what} is T5-XXL (t5xxl_fp16.safetensors, t5-v1_1-xxl-encoder GGUFs); UMT5 is Wan's encoder",
            "pick t5xxl_fp16.safetensors / t5xxl_fp8_e4m3fn_scaled.safetensors (or a T5-XXL encoder GGUF)",
        )


def final_norm_dtype(path: str | os.PathLike) -> torch.dtype:
    """The dtype the file stores ``encoder.final_layer_norm.weight`` in (a GGUF's F32 / F16 / BF16 as torch's),
    which ComfyUI takes as the weight dtype of a UMT5 encoder (its ``t5xxl_detect``)."""
    if str(path).lower().endswith(".gguf"):
        from .gguf.reader import GGUFFile
        from .gguf.t5_file import t5_gguf_shapes

        file = GGUFFile(Path(path).expanduser())
        kind = file.tensors[t5_gguf_shapes(file)[0]["encoder.final_layer_norm.weight"]].kind.name
        return {"F16": torch.float16, "BF16": torch.bfloat16}.get(kind, torch.float32)
    from .tensor_files import SafetensorsFile

    return SafetensorsFile(Path(path).expanduser()).entries["encoder.final_layer_norm.weight"].dtype
