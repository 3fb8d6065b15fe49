"""The original-layout tensor names and shapes of a model loaded from a diffusers folder.

A single-file model tells its original layout by its file header. A diffusers folder does not, yet
LoRA files for it are mostly written against the original layout (kohya ``lora_unet_double_blocks_...``,
ComfyUI ``diffusion_model....``). The skeleton here is that layout computed from the diffusers config:
names and shapes only, the inverse of ``original_layout.CONFIG_FROM_WEIGHTS``. Which rows of which
diffusers tensor each name holds is NOT written here: :func:`routing.probe_routing` asks the family's
converter. Tests check every skeleton against the model classes of ComfyUI itself and by converting it
to exactly the diffusers model's tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

Shape = tuple[int, ...]
TIMESTEP_FEATURES = 256  # sinusoidal timestep width every family embeds from


def _linear(out: dict[str, Shape], name: str, rows: int, cols: int, bias: bool = True) -> None:
    out[f"{name}.weight"] = (rows, cols)
    if bias:
        out[f"{name}.bias"] = (rows,)


def flux_skeleton(config: Mapping[str, Any]) -> dict[str, Shape]:
    """Black Forest Labs' Flux.1 layout (``double_blocks``, ``single_blocks``)."""
    head = int(config["attention_head_dim"])
    h = int(config["num_attention_heads"]) * head
    mlp = 4 * h
    in_channels = int(config["in_channels"])
    out: dict[str, Shape] = {}
    _linear(out, "img_in", h, in_channels)
    _linear(out, "time_in.in_layer", h, TIMESTEP_FEATURES)
    _linear(out, "time_in.out_layer", h, h)
    _linear(out, "vector_in.in_layer", h, int(config["pooled_projection_dim"]))
    _linear(out, "vector_in.out_layer", h, h)
    if config.get("guidance_embeds"):
        _linear(out, "guidance_in.in_layer", h, TIMESTEP_FEATURES)
        _linear(out, "guidance_in.out_layer", h, h)
    _linear(out, "txt_in", h, int(config["joint_attention_dim"]))
    for i in range(int(config["num_layers"])):
        for stream in ("img", "txt"):
            block = f"double_blocks.{i}.{stream}"
            _linear(out, f"{block}_mod.lin", 6 * h, h)
            _linear(out, f"{block}_attn.qkv", 3 * h, h)
            out[f"{block}_attn.norm.query_norm.scale"] = (head,)
            out[f"{block}_attn.norm.key_norm.scale"] = (head,)
            _linear(out, f"{block}_attn.proj", h, h)
            _linear(out, f"{block}_mlp.0", mlp, h)
            _linear(out, f"{block}_mlp.2", h, mlp)
    for i in range(int(config["num_single_layers"])):
        block = f"single_blocks.{i}"
        _linear(out, f"{block}.linear1", 3 * h + mlp, h)
        _linear(out, f"{block}.linear2", h, h + mlp)
        out[f"{block}.norm.query_norm.scale"] = (head,)
        out[f"{block}.norm.key_norm.scale"] = (head,)
        _linear(out, f"{block}.modulation.lin", 3 * h, h)
    _linear(out, "final_layer.linear", int(config.get("out_channels") or in_channels), h)
    _linear(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    return out


def sd3_skeleton(config: Mapping[str, Any]) -> dict[str, Shape]:
    """Stability's MMDiT layout of SD3 / SD3.5 (``joint_blocks``; the last context block is pre-only)."""
    head = int(config["attention_head_dim"])
    h = int(config["num_attention_heads"]) * head
    patch, in_channels = int(config["patch_size"]), int(config["in_channels"])
    layers = int(config["num_layers"])
    dual = set(config.get("dual_attention_layers") or ())
    qk_norm = bool(config.get("qk_norm"))
    side = int(config["pos_embed_max_size"])
    out: dict[str, Shape] = {"pos_embed": (1, side * side, h)}
    out["x_embedder.proj.weight"] = (h, in_channels, patch, patch)
    out["x_embedder.proj.bias"] = (h,)
    _linear(out, "t_embedder.mlp.0", h, TIMESTEP_FEATURES)
    _linear(out, "t_embedder.mlp.2", h, h)
    _linear(out, "y_embedder.mlp.0", h, int(config["pooled_projection_dim"]))
    _linear(out, "y_embedder.mlp.2", h, h)
    _linear(out, "context_embedder", int(config.get("caption_projection_dim") or h), int(config["joint_attention_dim"]))
    for i in range(layers):
        for part in ("x_block", "context_block"):
            block = f"joint_blocks.{i}.{part}"
            pre_only = part == "context_block" and i == layers - 1
            attns = ("attn", "attn2") if part == "x_block" and i in dual else ("attn",)
            chunks = 2 if pre_only else (9 if len(attns) == 2 else 6)
            for attn in attns:
                _linear(out, f"{block}.{attn}.qkv", 3 * h, h)
                if qk_norm:
                    out[f"{block}.{attn}.ln_q.weight"] = (head,)
                    out[f"{block}.{attn}.ln_k.weight"] = (head,)
                if not pre_only:
                    _linear(out, f"{block}.{attn}.proj", h, h)
            _linear(out, f"{block}.adaLN_modulation.1", chunks * h, h)
            if not pre_only:
                _linear(out, f"{block}.mlp.fc1", 4 * h, h)
                _linear(out, f"{block}.mlp.fc2", h, 4 * h)
    _linear(out, "final_layer.linear", patch * patch * int(config.get("out_channels") or in_channels), h)
    _linear(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    return out


SKELETONS: Mapping[str, Callable[[Mapping[str, Any]], dict[str, Shape]]] = MappingProxyType(
    {"flux": flux_skeleton, "sd3": sd3_skeleton}
)


def original_skeleton(family: str, config: Mapping[str, Any]) -> dict[str, Shape] | None:
    """The original layout of ``family`` for a diffusers ``config`` (None: no known original layout)."""
    build = SKELETONS.get(family)
    return build(config) if build else None
