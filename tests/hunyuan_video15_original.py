"""Test helper: a HunyuanVideo 1.5 diffusers state dict written in the original layouts (Tencent's release, the double
blocks' q/k/v apart; Comfy-Org's repackaging, fused), by the inverse of diffusers'
``scripts/convert_hunyuan_video1_5_to_diffusers.py``, stated as names apart from the loader's table."""

from __future__ import annotations

import torch

# diffusers module -> Tencent's (the inverse of diffusers' converter), below the block prefixes
TOP = {
    "x_embedder.proj": "img_in.proj",
    "time_embed.timestep_embedder.linear_1": "time_in.mlp.0",
    "time_embed.timestep_embedder.linear_2": "time_in.mlp.2",
    "context_embedder.proj_in": "txt_in.input_embedder",
    "context_embedder.time_text_embed.timestep_embedder.linear_1": "txt_in.t_embedder.mlp.0",
    "context_embedder.time_text_embed.timestep_embedder.linear_2": "txt_in.t_embedder.mlp.2",
    "context_embedder.time_text_embed.text_embedder.linear_1": "txt_in.c_embedder.linear_1",
    "context_embedder.time_text_embed.text_embedder.linear_2": "txt_in.c_embedder.linear_2",
    "context_embedder_2.norm": "byt5_in.layernorm",
    "context_embedder_2.linear_1": "byt5_in.fc1",
    "context_embedder_2.linear_2": "byt5_in.fc2",
    "context_embedder_2.linear_3": "byt5_in.fc3",
    "image_embedder.norm_in": "vision_in.proj.0",
    "image_embedder.linear_1": "vision_in.proj.1",
    "image_embedder.linear_2": "vision_in.proj.3",
    "image_embedder.norm_out": "vision_in.proj.4",
    "cond_type_embed": "cond_type_embedding",
    "proj_out": "final_layer.linear",
}
REFINER = {
    "norm1": "norm1",
    "norm2": "norm2",
    "attn.to_out.0": "self_attn_proj",
    "ff.net.0.proj": "mlp.fc1",
    "ff.net.2": "mlp.fc2",
    "norm_out.linear": "adaLN_modulation.1",
}
DOUBLE = {
    "norm1.linear": "img_mod.linear",
    "norm1_context.linear": "txt_mod.linear",
    "attn.to_q": "img_attn_q",
    "attn.to_k": "img_attn_k",
    "attn.to_v": "img_attn_v",
    "attn.add_q_proj": "txt_attn_q",
    "attn.add_k_proj": "txt_attn_k",
    "attn.add_v_proj": "txt_attn_v",
    "attn.norm_q": "img_attn_q_norm",
    "attn.norm_k": "img_attn_k_norm",
    "attn.norm_added_q": "txt_attn_q_norm",
    "attn.norm_added_k": "txt_attn_k_norm",
    "attn.to_out.0": "img_attn_proj",
    "attn.to_add_out": "txt_attn_proj",
    "ff.net.0.proj": "img_mlp.fc1",
    "ff.net.2": "img_mlp.fc2",
    "ff_context.net.0.proj": "txt_mlp.fc1",
    "ff_context.net.2": "txt_mlp.fc2",
}


def to_original(state: dict[str, torch.Tensor], fused: bool) -> dict[str, torch.Tensor]:
    """diffusers' names -> Tencent's (``fused``: Comfy-Org's repackaging, each stream's q/k/v in one tensor)."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        module, kind = name.rsplit(".", 1)
        parts = module.split(".")
        if module == "norm_out.linear":  # (scale, shift) in diffusers, (shift, scale) in the release
            out[f"final_layer.adaLN_modulation.1.{kind}"] = torch.cat(value.chunk(2)[::-1])
        elif module.startswith("context_embedder.token_refiner.refiner_blocks."):
            rest = ".".join(parts[4:])
            if rest not in ("attn.to_q", "attn.to_k", "attn.to_v"):  # fused below
                out[f"txt_in.individual_token_refiner.blocks.{parts[3]}.{REFINER[rest]}.{kind}"] = value
        elif module.startswith("transformer_blocks."):
            out[f"double_blocks.{parts[1]}.{DOUBLE['.'.join(parts[2:])]}.{kind}"] = value
        else:
            out[f"{TOP[module]}.{kind}"] = value
    for i in {int(k.split(".")[3]) for k in state if k.startswith("context_embedder.token_refiner.")}:
        base = f"context_embedder.token_refiner.refiner_blocks.{i}.attn.to_"
        for kind in ("weight", "bias"):
            out[f"txt_in.individual_token_refiner.blocks.{i}.self_attn_qkv.{kind}"] = torch.cat(
                [state[f"{base}{x}.{kind}"] for x in "qkv"]
            )
    if fused:
        for key in [k for k in out if "_attn_q." in k and k.startswith("double_blocks.")]:
            out[key.replace("_attn_q.", "_attn_qkv.")] = torch.cat(
                [out.pop(key.replace("_attn_q.", f"_attn_{x}.")) for x in "qkv"]
            )
    return out
