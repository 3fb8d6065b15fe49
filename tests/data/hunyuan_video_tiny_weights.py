"""Tiny HunyuanVideo 1.0 transformers and VAEs in ComfyUI's file layouts, with portable deterministic weights.

Shared by ``make_comfy_hunyuan_video_reference.py`` (which runs ComfyUI's own code on them) and the tests (which
run ours on the same weights and compare). Pure torch: no ComfyUI and no repository import.

The transformer is in Tencent's original names (what ComfyUI's HunyuanVideo files hold). ComfyUI derives its
head count as ``width // 128``, its rotary split as (16, 56, 56) and its pooled width as CLIP-L's 768, so even
1 + 1 blocks with 2 heads hold ~5 M parameters (20 MB): generated, not stored (see ``wan_tiny_weights``). The
VAE is ComfyUI's 3-D LDM layout (``decoder.up.N.block.M``) at 32 channels (ComfyUI's GroupNorm has 32 groups).
"""

from __future__ import annotations

import dataclasses

import torch
from wan_tiny_weights import hashed_uniform


@dataclasses.dataclass(frozen=True)
class TinyHunyuanVideo:
    """Structure of a tiny HunyuanVideo transformer (original names)."""

    heads: int = 2  # ComfyUI: num_heads = width // 128
    double_blocks: int = 1
    single_blocks: int = 1
    refiner_blocks: int = 2  # ComfyUI builds two
    in_channels: int = 16  # 33 for HunyuanVideo-I2V v1 (latent + start image latent + mask)
    text_dim: int = 32  # the Llama width (ComfyUI reads it from txt_in.input_embedder)
    guidance: bool = True

    @property
    def width(self) -> int:
        return 128 * self.heads


def _linear(out: dict, name: str, rows: int, cols: int) -> None:
    out[f"{name}.weight"] = ((rows, cols), f"w{cols}")
    out[f"{name}.bias"] = ((rows,), "bias")


def original_shapes(cfg: TinyHunyuanVideo) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, kind): kinds ``w<fan_in>`` (linear), ``bias``, ``norm`` (scale around 1)."""
    d, m, c = cfg.width, 4 * cfg.width, cfg.text_dim
    out: dict[str, tuple[tuple[int, ...], str]] = {
        "img_in.proj.weight": ((d, cfg.in_channels, 1, 2, 2), f"w{cfg.in_channels * 4}"),
        "img_in.proj.bias": ((d,), "bias"),
    }
    _linear(out, "time_in.mlp.0", d, 256)
    _linear(out, "time_in.mlp.2", d, d)
    _linear(out, "vector_in.in_layer", d, 768)
    _linear(out, "vector_in.out_layer", d, d)
    if cfg.guidance:
        _linear(out, "guidance_in.mlp.0", d, 256)
        _linear(out, "guidance_in.mlp.2", d, d)
    _linear(out, "txt_in.input_embedder", d, c)
    _linear(out, "txt_in.t_embedder.mlp.0", d, 256)
    _linear(out, "txt_in.t_embedder.mlp.2", d, d)
    _linear(out, "txt_in.c_embedder.linear_1", d, c)
    _linear(out, "txt_in.c_embedder.linear_2", d, d)
    for i in range(cfg.refiner_blocks):
        b = f"txt_in.individual_token_refiner.blocks.{i}."
        for norm in ("norm1", "norm2"):
            out[b + norm + ".weight"] = ((d,), "norm")
            out[b + norm + ".bias"] = ((d,), "bias")
        _linear(out, b + "self_attn_qkv", 3 * d, d)
        _linear(out, b + "self_attn_proj", d, d)
        _linear(out, b + "mlp.fc1", m, d)
        _linear(out, b + "mlp.fc2", d, m)
        _linear(out, b + "adaLN_modulation.1", 2 * d, d)
    for i in range(cfg.double_blocks):
        b = f"double_blocks.{i}."
        for side in ("img", "txt"):
            _linear(out, f"{b}{side}_mod.linear", 6 * d, d)
            _linear(out, f"{b}{side}_attn_qkv", 3 * d, d)
            out[f"{b}{side}_attn_q_norm.weight"] = ((128,), "norm")
            out[f"{b}{side}_attn_k_norm.weight"] = ((128,), "norm")
            _linear(out, f"{b}{side}_attn_proj", d, d)
            _linear(out, f"{b}{side}_mlp.fc1", m, d)
            _linear(out, f"{b}{side}_mlp.fc2", d, m)
    for i in range(cfg.single_blocks):
        b = f"single_blocks.{i}."
        _linear(out, b + "linear1", 3 * d + m, d)
        _linear(out, b + "linear2", d, d + m)
        out[b + "q_norm.weight"] = ((128,), "norm")
        out[b + "k_norm.weight"] = ((128,), "norm")
        _linear(out, b + "modulation.linear", 3 * d, d)
    _linear(out, "final_layer.linear", 16 * 4, d)
    _linear(out, "final_layer.adaLN_modulation.1", 2 * d, d)
    return out


def _values(name: str, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    if kind.startswith("w"):
        return hashed_uniform(name, shape, 3**0.5 / int(kind[1:]) ** 0.5)  # std 1/sqrt(fan_in)
    if kind == "norm":
        return hashed_uniform(name, shape, 0.1, 1.0)
    return hashed_uniform(name, shape, 0.05)


def tiny_hunyuan_video_state_dict(cfg: TinyHunyuanVideo, salt: str = "hunyuan") -> dict[str, torch.Tensor]:
    """Original-layout state dict of ``cfg``; ``salt`` gives a different model."""
    return {name: _values(f"{salt}/{name}", shape, kind) for name, (shape, kind) in original_shapes(cfg).items()}


VAE_CONFIG = {  # ComfyUI's ddconfig for a 3-D (video) LDM VAE (comfy.sd.VAE for "decoder.conv_in.conv.weight")
    "double_z": True,
    "z_channels": 16,
    "resolution": 256,
    "in_channels": 3,
    "out_ch": 3,
    "ch": 32,
    "ch_mult": [1, 1, 2, 2],
    "num_res_blocks": 1,
    "attn_resolutions": [],
    "dropout": 0.0,
    "conv3d": True,
    "time_compress": 4,
}


def vae_weight(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Weights of the tiny VAE by name: convs ~ 1/sqrt(fan_in), GroupNorm scales ~ 1, biases small."""
    if len(shape) == 1:
        scale_like = "norm" in name and name.endswith("weight")
        return hashed_uniform(name, shape, 0.1, 1.0) if scale_like else hashed_uniform(name, shape, 0.05)
    fan_in = 1
    for s in shape[1:]:
        fan_in *= s
    return hashed_uniform(name, shape, 3**0.5 / fan_in**0.5)
