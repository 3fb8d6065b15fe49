"""Tiny GGUF transformer files written with the ``gguf`` package, laid out as ComfyUI-GGUF's tools write them.

The rules follow ComfyUI-GGUF's ``tools/convert.py`` and its llama.cpp quantiser patch (read, not copied):
original-layout names; 1-D tensors, tensors of at most 1024 values and the architecture's high-precision
ones (Wan's ``.modulation``) in F32; a 5-D tensor (Wan's patch embedding) appended as F32 (what
``fix_5d_tensors.py`` does); every other 2-D weight in the file's quantised type unless the architecture keeps
it (embeddings and output layers) or its rows are not whole blocks (then the fallback type, F16 or BF16).
Types ``gguf.quants`` can quantise (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, BF16) are quantised from the values; the
K and IQ types are random valid blocks scaled to the weight's magnitude (std 1/sqrt(fan_in)).
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import torch

QUANTISABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16", "F16", "F32")
# fp16 fields (byte offsets) of one block: the scale d and, where the format has one, dmin / m
FACTORS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}
KEPT = {  # names (fragments) the quantiser leaves in the conversion type, per architecture
    "flux": ("txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer."),
    "hyvid": ("txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer."),
    "wan": ("modulation.", "patch_embedding.", "text_embedding.", "time_projection.", "time_embedding.", "head."),
    "qwen_image": (),
    "sd3": ("final_layer.", "context_embedder.", "t_embedder.", "y_embedder.", "x_embedder.", "pos_embed"),
    "lumina2": ("t_embedder.", "x_embedder.", "final_layer.", "cap_embedder.", "context_refiner.", "noise_refiner."),
    "hidream": (
        "p_embedder.",
        "t_embedder.",
        "x_embedder.",
        "final_layer.",
        ".ff_i.gate.weight",
        "caption_projection.",
    ),
    "ltxv": ("adaln_single.", "caption_projection.", "patchify_proj.", "proj_out.", "scale_shift_table"),
}
HIGH_PRECISION = {
    "wan": (".modulation",),
    "ltxv": ("scale_shift_table",),
    "hidream": (".ff_i.gate.weight", "img_emb.emb_pos"),  # ComfyUI-GGUF's keys_hiprec: plain parameters
}


def random_blocks(qtype: str, rows: int, cols: int, seed: int, std: float) -> np.ndarray:
    """uint8 [rows, bytes per row] of random valid ``qtype`` blocks whose values have about ``std``."""
    kind = gguf.GGMLQuantizationType[qtype]
    elements, nbytes = gguf.GGML_QUANT_SIZES[kind]
    n = rows * cols // elements
    raw = np.random.default_rng(seed).integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    one = np.array([1.0], dtype=np.float16).view(np.uint8)
    for at in FACTORS[qtype]:
        raw[:, at : at + 2] = one
    measured = float(gguf.quants.dequantize(raw.reshape(-1), kind).std()) or 1.0
    factor = np.array([std / measured], dtype=np.float16).view(np.uint8)
    for at in FACTORS[qtype]:
        raw[:, at : at + 2] = factor
    return raw.reshape(rows, -1)


def storage_type(name: str, tensor: torch.Tensor, arch: str, quant: str, fallback: str) -> str:
    if tensor.ndim <= 1 or tensor.numel() <= 1024 or any(k in name for k in HIGH_PRECISION.get(arch, ())):
        return "F32"
    if tensor.ndim > 4:
        return "F32"
    if tensor.ndim != 2 or any(k in name for k in KEPT.get(arch, ())):
        return fallback
    elements = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]][0]
    return quant if tensor.shape[-1] % elements == 0 else fallback


def write_gguf(
    path: Path,
    state: dict[str, torch.Tensor],
    arch: str | None,
    quant: str,
    fallback: str = "F16",
    prefix: str = "",
    types: dict[str, str] | None = None,
    seed: int = 0,
) -> Path:
    """Write ``state`` (original-layout names) as ``path``; ``types`` overrides the type of given names."""
    writer = gguf.GGUFWriter(path=None, arch=arch or "")
    if arch is None:
        writer.kv_data[0].pop("general.architecture", None)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    five_d = {}
    for i, (name, tensor) in enumerate(sorted(state.items())):
        qtype = (types or {}).get(name) or storage_type(name, tensor, arch or "", quant, fallback)
        if tensor.ndim > 4:
            five_d[prefix + name] = tensor  # appended last, as fix_5d_tensors.py does
            continue
        data = tensor.detach().to(torch.float32).numpy()
        kind = gguf.GGMLQuantizationType[qtype]
        if qtype in QUANTISABLE:
            packed = gguf.quants.quantize(data, kind)
        else:
            rows, cols = math.prod(tensor.shape[:-1]), tensor.shape[-1]
            packed = random_blocks(qtype, rows, cols, seed + i, 1.0 / math.sqrt(cols))
        writer.add_tensor(prefix + name, packed, raw_dtype=kind)
    for name, tensor in five_d.items():
        writer.add_tensor(name, tensor.detach().to(torch.float32).numpy(), raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
