"""Test helpers: tiny Qwen-Image / FLUX.2 transformers written as the files people download - the original
(BFL) layout for FLUX.2, and fp8 variants in the three conventions (plain e4m3fn, ComfyUI "fp8 scaled",
comfy-kitchen per-layer ``comfy_quant``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

FP8_MAX = 448.0


def flux2_to_bfl(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers FLUX.2 names -> Black Forest Labs' (fused q/k/v, adaLN as (shift, scale))."""
    src, out = dict(state), {}

    def move(a: str, b: str) -> None:
        for kind in ("weight", "bias"):
            if f"{a}.{kind}" in src:
                out[f"{b}.{kind}"] = src.pop(f"{a}.{kind}")

    def fuse(parts: list[str], b: str) -> None:
        out[f"{b}.weight"] = torch.cat([src.pop(f"{p}.weight") for p in parts])

    def norm(a: str, b: str) -> None:
        out[f"{b}.scale"] = src.pop(f"{a}.weight")

    move("x_embedder", "img_in")
    move("context_embedder", "txt_in")
    for a, b in (("timestep_embedder", "time_in"), ("guidance_embedder", "guidance_in")):
        move(f"time_guidance_embed.{a}.linear_1", f"{b}.in_layer")
        move(f"time_guidance_embed.{a}.linear_2", f"{b}.out_layer")
    for m in ("double_stream_modulation_img", "double_stream_modulation_txt", "single_stream_modulation"):
        move(f"{m}.linear", f"{m}.lin")
    blocks = {int(k.split(".")[1]) for k in state if k.startswith("transformer_blocks.")}
    for i in sorted(blocks):
        s, d = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        fuse([s + "attn.to_q", s + "attn.to_k", s + "attn.to_v"], d + "img_attn.qkv")
        fuse([s + "attn.add_q_proj", s + "attn.add_k_proj", s + "attn.add_v_proj"], d + "txt_attn.qkv")
        norm(s + "attn.norm_q", d + "img_attn.norm.query_norm")
        norm(s + "attn.norm_k", d + "img_attn.norm.key_norm")
        norm(s + "attn.norm_added_q", d + "txt_attn.norm.query_norm")
        norm(s + "attn.norm_added_k", d + "txt_attn.norm.key_norm")
        move(s + "attn.to_out.0", d + "img_attn.proj")
        move(s + "attn.to_add_out", d + "txt_attn.proj")
        move(s + "ff.linear_in", d + "img_mlp.0")
        move(s + "ff.linear_out", d + "img_mlp.2")
        move(s + "ff_context.linear_in", d + "txt_mlp.0")
        move(s + "ff_context.linear_out", d + "txt_mlp.2")
    singles = {int(k.split(".")[1]) for k in state if k.startswith("single_transformer_blocks.")}
    for i in sorted(singles):
        s, d = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        move(s + "attn.to_qkv_mlp_proj", d + "linear1")
        move(s + "attn.to_out", d + "linear2")
        norm(s + "attn.norm_q", d + "norm.query_norm")
        norm(s + "attn.norm_k", d + "norm.key_norm")
    move("proj_out", "final_layer.linear")
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat(src.pop("norm_out.linear.weight").chunk(2)[::-1])
    assert not src, f"unmapped diffusers tensors: {sorted(src)[:8]}"
    return out


def _linear(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(".weight") and tensor.ndim == 2


def to_fp8(state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """``state`` with every Linear weight in float8_e4m3fn: "plain" (value cast), "scaled" (ComfyUI's
    ``scaled_fp8`` marker + ``.scale_weight``) or "comfy_quant" (``.comfy_quant`` + ``.weight_scale``)."""
    out: dict[str, torch.Tensor] = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)} if kind == "scaled" else {}
    blob = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)
    for name, value in state.items():
        if not _linear(name, value):
            out[name] = value.to(torch.bfloat16)
            continue
        w = value.float()
        if kind == "plain":
            out[name] = w.to(torch.float8_e4m3fn)
            continue
        scale = (w.abs().max() / FP8_MAX).clamp(min=1e-12)
        out[name] = (w / scale).to(torch.float8_e4m3fn)
        layer = name[: -len(".weight")]
        if kind == "scaled":
            out[f"{layer}.scale_weight"] = scale.reshape(())
        else:
            out[f"{layer}.weight_scale"] = scale.reshape(())
            out[f"{layer}.comfy_quant"] = blob.clone()
    return out


def save(state: dict[str, torch.Tensor], path: Path, prefix: str = "") -> Path:
    save_file({prefix + k: v.contiguous() for k, v in state.items()}, str(path))
    return path
