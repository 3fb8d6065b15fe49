"""A tiny LTX-Video 0.9.1-style VAE decoder in Lightricks' layout (what the ``vae.`` part of an
``ltx-video-2b-v0.9.1.safetensors`` checkpoint holds), with portable deterministic weights.

Shared by ``make_comfy_ltx_video_vae_reference.py`` (ComfyUI's own code decodes with it) and the tests (ours does).
Pure torch. ComfyUI builds the decoder from the checkpoint's ``config`` metadata (``vae``) with 128 base channels, so
the tiny decoder is 128 wide at every level (compress_all upsamplers with multiplier 1), one or two resnets per
level, the timestep conditioning and injected noise of 0.9.1, one upsampler without its residual; no encoder (ComfyUI
loads it without one; ours never encodes). ~15 M parameters, generated, not stored.
"""

from __future__ import annotations

import json

import torch
from wan_tiny_weights import hashed_uniform

WIDTH, LATENT, PATCH = 128, 128, 4
# ComfyUI's decoder_blocks, listed from the pixel side (its Decoder reverses them): resnets and upsamplers in turn
DECODER_BLOCKS = [
    ["res_x", {"num_layers": 1, "inject_noise": True}],
    ["compress_all", {"residual": True, "multiplier": 1}],
    ["res_x", {"num_layers": 2, "inject_noise": True}],
    ["compress_all", {"residual": False, "multiplier": 1}],
    ["res_x", {"num_layers": 1, "inject_noise": True}],
    ["compress_all", {"residual": True, "multiplier": 1}],
    ["res_x", {"num_layers": 1, "inject_noise": False}],
]
VAE_CONFIG = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": LATENT,
    "decoder_blocks": DECODER_BLOCKS,
    "encoder_blocks": [["res_x", {"num_layers": 1}], ["compress_all", {}], ["compress_all", {}], ["compress_all", {}]],
    "scaling_factor": 1.0,
    "norm_layer": "pixel_norm",
    "patch_size": PATCH,
    "latent_log_var": "uniform",
    "use_quant_conv": False,
    "causal_decoder": False,
    "timestep_conditioning": True,
}  # fmt: skip  (no spatial_padding_mode: ComfyUI's decoder pads with reflect, as for Lightricks' 0.9.1 config)


def checkpoint_metadata() -> dict[str, str]:
    """The safetensors metadata ComfyUI's Load Checkpoint reads the VAE's structure from."""
    return {"config": json.dumps({"vae": VAE_CONFIG})}


def _linear(out: dict, name: str, rows: int, cols: int) -> None:
    out[f"{name}.weight"] = ((rows, cols), f"w{cols}")
    out[f"{name}.bias"] = ((rows,), "bias")


def _conv(out: dict, name: str, rows: int, cols: int, kind: str = "") -> None:
    out[f"{name}.conv.weight"] = ((rows, cols, 3, 3, 3), kind or f"w{cols * 27}")
    out[f"{name}.conv.bias"] = ((rows,), "bias")


def original_shapes() -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name (without ``vae.``) -> (shape, kind): ``w<fan_in>``, ``bias``, ``table``, ``noise``, ``stat*``."""
    c = WIDTH
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    _conv(out, "decoder.conv_in", c, LATENT)
    for i, (name, params) in enumerate(reversed(DECODER_BLOCKS)):
        piece = f"decoder.up_blocks.{i}"
        if name == "compress_all":
            _conv(out, f"{piece}.conv", c * 8 // params["multiplier"], c)
            continue
        _linear(out, f"{piece}.time_embedder.timestep_embedder.linear_1", 4 * c, 256)
        _linear(out, f"{piece}.time_embedder.timestep_embedder.linear_2", 4 * c, 4 * c)
        for j in range(params["num_layers"]):
            block = f"{piece}.res_blocks.{j}"
            _conv(out, f"{block}.conv1", c, c)
            _conv(out, f"{block}.conv2", c, c)
            out[f"{block}.scale_shift_table"] = ((4, c), "table")
            if params["inject_noise"]:
                out[f"{block}.per_channel_scale1"] = ((c, 1, 1), "noise")
                out[f"{block}.per_channel_scale2"] = ((c, 1, 1), "noise")
    _conv(out, "decoder.conv_out", 3 * PATCH * PATCH, c, f"w{c * 27 * 8}")  # smaller: few pixels clamp
    out["decoder.timestep_scale_multiplier"] = ((), "multiplier")
    _linear(out, "decoder.last_time_embedder.timestep_embedder.linear_1", 2 * c, 256)
    _linear(out, "decoder.last_time_embedder.timestep_embedder.linear_2", 2 * c, 2 * c)
    out["decoder.last_scale_shift_table"] = ((2, c), "table")
    out["per_channel_statistics.mean-of-means"] = ((LATENT,), "stat_mean")
    out["per_channel_statistics.std-of-means"] = ((LATENT,), "stat_std")
    return out


def _values(name: str, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    if kind.startswith("w"):
        return hashed_uniform(name, shape, 3**0.5 / int(kind[1:]) ** 0.5)  # std 1/sqrt(fan_in)
    if kind == "multiplier":
        return torch.tensor(1000.0)
    scale, offset = {"table": (0.2, 0.0), "noise": (0.5, 0.0), "stat_mean": (0.1, 0.0), "stat_std": (0.4, 1.0)}.get(
        kind, (0.05, 0.0)
    )
    return hashed_uniform(name, shape, scale, offset)


def tiny_ltx_vae_state_dict(salt: str = "ltx-vae-091") -> dict[str, torch.Tensor]:
    """The decoder's tensors in Lightricks' names (no ``vae.`` prefix); ``salt`` gives other weights."""
    return {name: _values(f"{salt}/{name}", shape, kind) for name, (shape, kind) in original_shapes().items()}
