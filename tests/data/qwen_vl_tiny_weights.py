"""A tiny Qwen2.5-VL text encoder WITH its vision tower, in ComfyUI's ``qwen_2.5_vl_7b*.safetensors`` layout
(``model.*`` text, ``visual.*`` vision), with portable deterministic weights.

Shared by ``make_comfy_qwen_edit_text_reference.py`` (which runs ComfyUI's TextEncodeQwenImageEdit(Plus) on it)
and the tests (which run ours on the same weights). Pure torch: no ComfyUI and no repository import.

Why generated and not stored: ComfyUI tokenizes Qwen-Image prompts with its own Qwen2.5 tokenizer and finds the
image placeholder and the template's end by Qwen's real token ids (151655, 151644, 872, 198), so the embedding
has Qwen2.5-VL-7B's 152064 rows even 24 wide (3.6 M values). Values come from ``wan_tiny_weights.hashed_uniform``.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch
from wan_tiny_weights import hashed_uniform


@dataclasses.dataclass(frozen=True)
class TinyQwenVL:
    """Sizes of the tiny encoder (what a file's shapes cannot show is noted)."""

    vocab: int = 152064  # Qwen2.5-VL-7B's
    width: int = 24
    ffn: int = 48
    layers: int = 2
    heads: int = 2  # not in the shapes: head_dim 12 is passed as an override
    kv_heads: int = 1
    head_dim: int = 12
    vision_width: int = 16
    vision_ffn: int = 32
    vision_heads: int = 2  # not in the shapes
    vision_layers: int = 2
    vision_full_attention: tuple[int, ...] = (1,)  # not in the shapes: block 0 attends by windows, block 1 fully


def comfy_shapes(cfg: TinyQwenVL) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, kind); kinds: ``w<fan_in>`` linear weight, ``bias``, ``norm`` (around 1), ``embed``."""
    d, v = cfg.width, cfg.vision_width
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "model.embed_tokens.weight": ((cfg.vocab, d), "embed"),
        "model.norm.weight": ((d,), "norm"),
    }
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ((d,), "norm")
        out[p + "post_attention_layernorm.weight"] = ((d,), "norm")
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out[p + f"self_attn.{name}.weight"] = ((rows, d), f"w{d}")
            out[p + f"self_attn.{name}.bias"] = ((rows,), "bias")
        out[p + "self_attn.o_proj.weight"] = ((d, q), f"w{q}")
        out[p + "mlp.gate_proj.weight"] = ((cfg.ffn, d), f"w{d}")
        out[p + "mlp.up_proj.weight"] = ((cfg.ffn, d), f"w{d}")
        out[p + "mlp.down_proj.weight"] = ((d, cfg.ffn), f"w{cfg.ffn}")
    patch = 3 * 2 * 14 * 14
    out["visual.patch_embed.proj.weight"] = ((v, 3, 2, 14, 14), f"w{patch}")
    for i in range(cfg.vision_layers):
        p = f"visual.blocks.{i}."
        out[p + "norm1.weight"] = ((v,), "norm")
        out[p + "norm2.weight"] = ((v,), "norm")
        for name, rows, cols in (
            ("attn.qkv", 3 * v, v),
            ("attn.proj", v, v),
            ("mlp.gate_proj", cfg.vision_ffn, v),
            ("mlp.up_proj", cfg.vision_ffn, v),
            ("mlp.down_proj", v, cfg.vision_ffn),
        ):
            out[p + name + ".weight"] = ((rows, cols), f"w{cols}")
            out[p + name + ".bias"] = ((rows,), "bias")
    merged = 4 * v
    out["visual.merger.ln_q.weight"] = ((v,), "norm")
    out["visual.merger.mlp.0.weight"] = ((merged, merged), f"w{merged}")
    out["visual.merger.mlp.0.bias"] = ((merged,), "bias")
    out["visual.merger.mlp.2.weight"] = ((d, merged), f"w{merged}")
    out["visual.merger.mlp.2.bias"] = ((d,), "bias")
    return out


def comfy_state(cfg: TinyQwenVL = TinyQwenVL()) -> dict[str, torch.Tensor]:
    """The file's tensors (float32; a test saves them as bf16)."""
    out = {}
    for name, (shape, kind) in comfy_shapes(cfg).items():
        if kind == "embed":
            out[name] = hashed_uniform(name, shape, 1.0)
        elif kind == "norm":
            out[name] = hashed_uniform(name, shape, 0.1, 1.0)
        elif kind == "bias":
            out[name] = hashed_uniform(name, shape, 0.05)
        else:
            out[name] = hashed_uniform(name, shape, (3.0 / int(kind[1:])) ** 0.5)
    return out


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over the names and the bf16 bits of every tensor (what the test rebuilt = what was used)."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def smooth_image(height: int, width: int, seed: int) -> torch.Tensor:
    """A smooth IMAGE ([1, H, W, 3] in [0, 1]) with some detail, a pure function of its arguments."""
    y = torch.linspace(0, 1, height).view(-1, 1, 1)
    x = torch.linspace(0, 1, width).view(1, -1, 1)
    phase = torch.tensor([0.0, 2.1, 4.2]).view(1, 1, 3) + seed
    img = 0.5 + 0.3 * torch.sin(6.0 * x + 4.0 * y + phase) + 0.2 * torch.cos(17.0 * x * y + phase)
    return img.clamp(0, 1).unsqueeze(0)
