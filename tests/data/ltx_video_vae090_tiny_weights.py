"""A tiny LTX-Video 0.9.0 VAE in Lightricks' layout (what the ``vae.`` part of ``ltx-video-2b-v0.9.safetensors``
holds) that ComfyUI's own decoder can be built for, with deterministic weights.

Shared by ``make_comfy_ltx_video_vae_reference.py`` (ComfyUI decodes with it) and the tests (ours does). ComfyUI
builds the 0.9.0 decoder 128 wide at the pixel side and doubles the width at each ``res_x_y``, so the widths are the
release's (128, 256, 512, 512); only the resnets per level are cut to one. Names and shapes come from diffusers'
AutoencoderKLLTXVideo (on the meta device) renamed to Lightricks' pieces; values from a CPU generator seeded by the
tensor's name (the tests check the digest stored with the reference, so a generator that draws otherwise fails
loudly); the encoder (only read for its shapes) is narrow and zeros. ~120 M parameters: generated, not stored.
"""

from __future__ import annotations

import json
import zlib

import torch

WIDTHS, LATENT, PATCH = (128, 256, 512, 512), 128, 4
ENCODER_WIDTHS = (8, 16, 32, 32)  # the encoder is only read for its shapes (ComfyUI is not given it): kept small
BLOCKS = [
    ["res_x", 1],
    ["compress_all", 1],
    ["res_x_y", 1],
    ["res_x", 1],
    ["compress_all", 1],
    ["res_x_y", 1],
    ["res_x", 1],
    ["compress_all", 1],
    ["res_x", 1],
    ["res_x", 1],
]  # from the pixel side
VAE_CONFIG = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": LATENT,
    "blocks": BLOCKS,
    "scaling_factor": 1.0,
    "norm_layer": "pixel_norm",
    "patch_size": PATCH,
    "latent_log_var": "uniform",
    "use_quant_conv": False,
    "causal_decoder": False,
}  # no spatial_padding_mode, as Lightricks' 0.9.0 config: ComfyUI's decoder pads with reflect
# diffusers' pieces -> Lightricks' 0.9.0 pieces (most specific first)
PIECES = (
    ("decoder.mid_block.", "decoder.up_blocks.0."), ("decoder.up_blocks.0.", "decoder.up_blocks.1."),
    ("decoder.up_blocks.1.upsamplers.0.", "decoder.up_blocks.2."), ("decoder.up_blocks.1.", "decoder.up_blocks.3."),
    ("decoder.up_blocks.2.conv_in.", "decoder.up_blocks.4."), ("decoder.up_blocks.2.upsamplers.0.", "decoder.up_blocks.5."),
    ("decoder.up_blocks.2.", "decoder.up_blocks.6."), ("decoder.up_blocks.3.conv_in.", "decoder.up_blocks.7."),
    ("decoder.up_blocks.3.upsamplers.0.", "decoder.up_blocks.8."), ("decoder.up_blocks.3.", "decoder.up_blocks.9."),
    ("encoder.down_blocks.0.downsamplers.0.", "encoder.down_blocks.1."), ("encoder.down_blocks.0.conv_out.", "encoder.down_blocks.2."),
    ("encoder.down_blocks.0.", "encoder.down_blocks.0."), ("encoder.down_blocks.1.downsamplers.0.", "encoder.down_blocks.4."),
    ("encoder.down_blocks.1.conv_out.", "encoder.down_blocks.5."), ("encoder.down_blocks.1.", "encoder.down_blocks.3."),
    ("encoder.down_blocks.2.downsamplers.0.", "encoder.down_blocks.7."), ("encoder.down_blocks.2.", "encoder.down_blocks.6."),
    ("encoder.down_blocks.3.", "encoder.down_blocks.8."), ("encoder.mid_block.", "encoder.down_blocks.9."),
)  # fmt: skip
NAMES = ((".resnets.", ".res_blocks."), (".conv_shortcut.conv.", ".conv_shortcut."), (".norm3.", ".norm3.norm."))
STATISTICS = {
    "latents_mean": "per_channel_statistics.mean-of-means",
    "latents_std": "per_channel_statistics.std-of-means",
}


def checkpoint_metadata(**vae: str) -> dict[str, str]:
    """The safetensors metadata ComfyUI's Load Checkpoint reads the VAE's structure from (``vae``: extra keys)."""
    return {"config": json.dumps({"vae": VAE_CONFIG | vae})}


def original_name(name: str) -> str:
    if name in STATISTICS:
        return STATISTICS[name]
    for diffusers, original in PIECES:
        if name.startswith(diffusers):
            name = original + name[len(diffusers) :]
            break
    for diffusers, original in NAMES:
        name = name.replace(diffusers, original)
    return name


def original_shapes() -> dict[str, tuple[int, ...]]:
    from diffusers import AutoencoderKLLTXVideo

    with torch.device("meta"):
        vae = AutoencoderKLLTXVideo(
            latent_channels=LATENT,
            block_out_channels=ENCODER_WIDTHS,
            decoder_block_out_channels=WIDTHS,
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            patch_size=PATCH,
        )
    return {original_name(k): tuple(v.shape) for k, v in vae.state_dict().items()}


def _values(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if "/encoder." in name:
        return torch.zeros(shape)  # read for its shapes only: nothing here encodes (ComfyUI is not given it)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode("utf-8")))
    u = torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1
    if name.endswith("mean-of-means"):
        return 0.1 * u
    if name.endswith("std-of-means"):
        return 1.0 + 0.4 * u
    if len(shape) > 1:
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        gain = 0.5 if "decoder.conv_out" in name else 1.0  # few pixels clamp
        return u * gain * (3.0 / fan_in) ** 0.5  # std 1/sqrt(fan_in)
    return 0.05 * u


def tiny_ltx_vae090_state_dict(salt: str = "ltx-vae-090") -> dict[str, torch.Tensor]:
    """The VAE's tensors (encoder: zeros, decoder, statistics) in Lightricks' names, no ``vae.`` prefix."""
    return {name: _values(f"{salt}/{name}", shape) for name, shape in original_shapes().items()}
