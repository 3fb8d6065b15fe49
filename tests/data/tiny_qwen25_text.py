"""A tiny seeded Qwen2.5-VL text model, written as the two files ComfyUI users keep in models/text_encoders:
ComfyUI's ``qwen_2.5_vl_7b.safetensors`` layout (bf16, Hugging Face names under ``model.``) and a llama.cpp GGUF
(general.architecture "qwen2vl", names from the ``gguf`` package's tensor map, Linear weights and the token
embedding Q8_0, norms and biases F32), as ComfyUI-GGUF's CLIPLoaderGGUF reads it.

Shared by tests/data/make_comfy_qwen25_text_reference.py (ComfyUI's venv) and the test that checks against its
output; imports nothing from parallel_runtime. The files are made again from the seed (the embedding alone is
Qwen's full 151,680-token vocabulary, 20 MB), and their digests are stored with the reference.

The vocabulary is Qwen's (ComfyUI's tokenizer is used, and ComfyUI drops the template by finding
<|im_start|> = 151644); the rest is small: 64 wide, 4 query and 2 key/value heads of 16, feed-forward 128,
2 layers (a head width the runtime takes as an override; transformers derives it from width / heads).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

SEED = 20251127
VOCAB, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FF, LAYERS = 151680, 64, 4, 2, 16, 128, 2
ROPE_SECTIONS = [4, 2, 2]  # Qwen2.5-VL's [16, 24, 24] for 128-wide heads, for 16-wide ones (text: all alike)
FILES = {"bf16": "tiny_qwen_2.5_vl_7b_bf16.safetensors", "Q8_0": "tiny-Qwen2.5-VL-7B-Instruct-Q8_0.gguf"}


def tiny_tensors() -> dict[str, torch.Tensor]:
    """Seeded random weights under ComfyUI's names (float32)."""
    g = torch.Generator().manual_seed(SEED)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    sd = {"model.embed_tokens.weight": rand(VOCAB, WIDTH)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + rand(WIDTH, scale=0.1)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            sd[f"{p}self_attn.{name}.weight"] = rand(rows, WIDTH, scale=WIDTH**-0.5)
            sd[f"{p}self_attn.{name}.bias"] = rand(rows, scale=0.1)
        sd[p + "self_attn.o_proj.weight"] = rand(WIDTH, q, scale=q**-0.5)
        sd[p + "post_attention_layernorm.weight"] = 1 + rand(WIDTH, scale=0.1)
        sd[p + "mlp.gate_proj.weight"] = rand(FF, WIDTH, scale=WIDTH**-0.5)
        sd[p + "mlp.up_proj.weight"] = rand(FF, WIDTH, scale=WIDTH**-0.5)
        sd[p + "mlp.down_proj.weight"] = rand(WIDTH, FF, scale=FF**-0.5)
    sd["model.norm.weight"] = 1 + rand(WIDTH, scale=0.1)
    return sd


def write_safetensors(path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tiny_tensors().items()}, str(path))
    return path


def write_gguf(path: Path, arch: str = "qwen2vl") -> Path:
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, LAYERS)
    writer = gguf.GGUFWriter(path=None, arch=arch)
    for name, value in tiny_tensors().items():
        kind = gguf.GGMLQuantizationType.Q8_0 if value.ndim == 2 else gguf.GGMLQuantizationType.F32
        packed = gguf.quants.quantize(value.numpy(), kind)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), packed, raw_dtype=kind)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write(case: str, folder: Path) -> Path:
    """The ``case`` file ("bf16" or "Q8_0") in ``folder``."""
    path = folder / FILES[case]
    return write_gguf(path) if case == "Q8_0" else write_safetensors(path)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
