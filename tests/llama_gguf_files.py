"""A tiny Llama as llama.cpp's converter writes it to a GGUF (the HunyuanVideo and HiDream Llama GGUF tests), with
the weights ComfyUI-GGUF's own dequantisation gives of it (the oracle's safetensors file)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_llama_gguf(tiny, path: Path) -> dict[str, torch.Tensor]:
    """The tiny Llama as llama.cpp's converter writes it (its names, each head's query / key rows in interleaved
    pairs, 2-D tensors Q8_0, norms F32, sizes as llama.* metadata); returns the weights ComfyUI-GGUF's own
    dequantisation gives of it, under ComfyUI's names in transformers' row order (the oracle's file)."""
    import gguf
    from comfy_gguf import comfy_dequantise

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, tiny.LAYERS)
    writer = gguf.GGUFWriter(path=None, arch="llama")
    writer.add_block_count(tiny.LAYERS)
    writer.add_embedding_length(tiny.WIDTH)
    writer.add_feed_forward_length(tiny.FF)
    writer.add_head_count(tiny.HEADS)
    writer.add_head_count_kv(tiny.KV_HEADS)
    writer.add_key_length(tiny.HEAD_DIM)
    writer.add_value_length(tiny.HEAD_DIM)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    oracle = {}
    for name, value in tiny.tiny_tensors().items():
        stored = value
        for projection, heads in (("q_proj", tiny.HEADS), ("k_proj", tiny.KV_HEADS)):
            if name.endswith(projection + ".weight"):
                rows = value.shape[0]
                stored = value.reshape(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(value.shape)
        kind = gguf.GGMLQuantizationType.Q8_0 if value.ndim == 2 else gguf.GGMLQuantizationType.F32
        packed = gguf.quants.quantize(stored.numpy(), kind)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), packed, raw_dtype=kind)
        if value.ndim == 2:
            packed = torch.from_numpy(gguf.quants.quantize(value.numpy(), kind))
            value = comfy_dequantise(packed, "Q8_0", tuple(value.shape), torch.float32)
        oracle[name] = value.float().contiguous()
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return oracle
