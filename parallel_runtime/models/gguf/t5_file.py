"""A T5 / UMT5 encoder from a llama.cpp GGUF file (general.architecture "t5encoder" or "t5"), as ComfyUI-GGUF's
CLIPLoaderGGUF reads ``t5-v1_1-xxl-encoder-Q8_0.gguf`` / ``umt5-xxl-encoder-Q8_0.gguf``.

The file's names (``enc.blk.N.attn_q.weight``, ``token_embd.weight``, ``enc.output_norm.weight``) are found from
the original checkpoints' names through the ``gguf`` package's tensor map (``gguf.text_model``); the sizes come
from the tensors' shapes (``t5_layout.t5_sizes``). Linear weights stay in their GGML blocks; the token
embedding is dequantised once at load and held in float16, as ComfyUI-GGUF does with UMT5-XXL's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..t5_encoder import T5TextEncoder
from ..t5_layout import t5_sizes
from ..weights import TensorSource, load_tensors, parameters_on_meta
from .reader import GGUFFile
from .text_model import check_text_architecture, llama_cpp_names, text_source_fields

T5_ARCHITECTURES = ("t5encoder", "t5")


def t5_gguf_shapes(file: GGUFFile) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """(original name -> the file's tensor name, original name -> shape) of every encoder tensor of ``file``."""
    blocks = 1 + max((int(k.split(".")[2]) for k in file.tensors if k.startswith("enc.blk.")), default=-1)
    wanted = ["shared.weight", "encoder.final_layer_norm.weight"]
    for i in range(blocks):
        attn, ff = f"encoder.block.{i}.layer.0.", f"encoder.block.{i}.layer.1."
        wanted += [f"{attn}SelfAttention.{p}.weight" for p in ("q", "k", "v", "o", "relative_attention_bias")]
        wanted += [f"{attn}layer_norm.weight", f"{ff}layer_norm.weight"]
        wanted += [f"{ff}DenseReluDense.{p}.weight" for p in ("wi_0", "wi_1", "wo", "wi")]
    names = llama_cpp_names(file, wanted)
    return names, {n: tuple(file.tensors[k].shape) for n, k in names.items()}


def load_t5_gguf(path: Path, device, dtype: torch.dtype, storage: str = "auto", what: str = "T5") -> nn.Module:
    """The T5 / UMT5 encoder of a GGUF file (see the module doc), on ``device``."""
    file = GGUFFile(path)
    check_text_architecture(file, T5_ARCHITECTURES, what)
    names, shapes = t5_gguf_shapes(file)
    with parameters_on_meta():
        model = T5TextEncoder(t5_sizes(shapes, file.path.name, what))
    wanted = [n for n, _ in model.named_parameters()]
    source = TensorSource(**text_source_fields(file, {n: names.get(n, f"(no tensor for {n})") for n in wanted}))
    load_tensors(model, source, lambda name: "all", device, dtype, what=f"of the {what} encoder", storage=storage)
    if file.tensors[names["shared.weight"]].kind.packed:  # dequantised in float16 products: exact in float16,
        model.shared.weight.data = model.shared.weight.data.to(torch.float16)  # half the bytes (UMT5's is 1B values)
    return model.eval().requires_grad_(False)
