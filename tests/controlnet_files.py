"""Tiny ControlNet files in the layouts ComfyUI 0.3.64 detects, built from their module classes with
deterministic weights (per tensor name), at the widths of the tiny reference Flux (tests/data/comfy_ref_flux_dev:
hidden 64, 16-wide heads, rope axes 4/6/6, text 32, pooled 24, guidance input).

``python tests/controlnet_files.py`` rewrites the stored files under tests/data (the ComfyUI reference generator
reads them from there); tests/test_controlnet_flux.py checks the stored file is what this builds.
"""

from __future__ import annotations

import math
import sys
import zlib
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data"
FLUX_UNION = DATA / "tiny_flux_controlnet_union.safetensors"
FLUX_XLABS = DATA / "tiny_flux_controlnet_xlabs.safetensors"
FLUX_MISTOLINE = DATA / "tiny_flux_controlnet_mistoline.safetensors"
MISTOLINE_BLOCKS = (2, 3)  # double, single blocks of the tiny Mistoline file
MISTOLINE_KERNELS = (3, 1, 3, 3, 3, 3, 3, 3, 1, 3)  # its hint encoder's convolutions (input_cond_block.encoder.2k)
QWEN_INSTANTX = DATA / "tiny_qwen_controlnet_instantx.safetensors"
QWEN_INSTANTX_INPAINT = DATA / "tiny_qwen_controlnet_instantx_inpaint.safetensors"  # x embedder: 64 + 4 mask
QWEN_DIFFSYNTH = DATA / "tiny_qwen_diffsynth_controlnet.safetensors"
QWEN_DIFFSYNTH_INPAINT = DATA / "tiny_qwen_diffsynth_inpaint.safetensors"  # img_in reads the latent and a mask
QWEN_DIFFSYNTH_BLOCKS = 3  # one per block of the tiny Qwen-Image (DiffSynth's files: 60, one per Qwen-Image block)
QWEN_INSTANTX_CONFIG = {  # the tiny Qwen-Image of tests/data/make_comfy_qwen_image_reference.py, 2 ControlNet blocks
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "joint_attention_dim": 24,
    "axes_dims_rope": (4, 6, 6),
}
XLABS_DOUBLE_BLOCKS = 2  # XLabs' released Flux ControlNets: 2 double blocks, no single blocks
HINT_CONVS = 8  # the pixel hint's conv stack: 3 -> 16, then 16 -> 16 (strides 1 2 1 2 1 2 1 after the first)
FLUX_UNION_CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 1,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 32,
    "pooled_projection_dim": 24,
    "guidance_embeds": True,
    "axes_dims_rope": [4, 6, 6],
    "num_mode": 10,
}


def _value(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    t = torch.randn(shape, generator=g)
    if name.endswith(("norm_q.weight", "norm_k.weight", "_norm.scale")):
        return 1.0 + 0.1 * t  # RMS-norm scales
    if len(shape) == 1:
        return 0.02 * t
    scale = 1.0 if "embedder.weight" in name and "mode" in name else 1.0 / math.sqrt(math.prod(shape[1:]))
    return t * scale


def flux_union_state(config: dict | None = None) -> dict[str, torch.Tensor]:
    """The tiny Flux Union ControlNet (diffusers' FluxControlNetModel names), stored as fp16; ``config`` other
    widths than FLUX_UNION_CONFIG's."""
    from diffusers.models.controlnets.controlnet_flux import FluxControlNetModel

    with torch.device("meta"):
        model = FluxControlNetModel(**(config or FLUX_UNION_CONFIG))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    return {k: _value(k, s).to(torch.float16).contiguous() for k, s in sorted(shapes.items())}


def flux_xlabs_state() -> dict[str, torch.Tensor]:
    """The tiny XLabs Flux ControlNet in the layout ComfyUI detects (Black Forest Labs' block names,
    ``controlnet_blocks.N``, ``pos_embed_input``, a pixel-hint conv stack ``input_hint_block.2k``), as fp16."""
    from parallel_runtime.models.families.flux.keys import skeleton

    config = {**FLUX_UNION_CONFIG, "num_layers": XLABS_DOUBLE_BLOCKS, "num_single_layers": 0}
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    shapes = {k: v for k, v in skeleton(config).items() if not k.startswith("final_layer.")}
    for i in range(XLABS_DOUBLE_BLOCKS):
        shapes[f"controlnet_blocks.{i}.weight"], shapes[f"controlnet_blocks.{i}.bias"] = (hidden, hidden), (hidden,)
    shapes["pos_embed_input.weight"], shapes["pos_embed_input.bias"] = (hidden, config["in_channels"]), (hidden,)
    for k in range(HINT_CONVS):
        shapes[f"input_hint_block.{2 * k}.weight"] = (16, 3 if k == 0 else 16, 3, 3)
        shapes[f"input_hint_block.{2 * k}.bias"] = (16,)
    return {k: _value(k, tuple(s)).to(torch.float16).contiguous() for k, s in sorted(shapes.items())}


def flux_mistoline_state() -> dict[str, torch.Tensor]:
    """The tiny Mistoline Flux ControlNet in the layout ComfyUI detects (Black Forest Labs' block names, double and
    single blocks, control blocks ``controlnet_blocks.N.linear`` / ``single_controlnet_blocks.N.linear``,
    ``pos_embed_input``, a ten-convolution hint encoder ``input_cond_block.encoder.2k``), as fp16."""
    from parallel_runtime.models.families.flux.keys import skeleton

    doubles, singles = MISTOLINE_BLOCKS
    config = {**FLUX_UNION_CONFIG, "num_layers": doubles, "num_single_layers": singles}
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    shapes = {k: v for k, v in skeleton(config).items() if not k.startswith("final_layer.")}
    for prefix, count in (("controlnet_blocks", doubles), ("single_controlnet_blocks", singles)):
        for i in range(count):
            shapes[f"{prefix}.{i}.linear.weight"], shapes[f"{prefix}.{i}.linear.bias"] = (hidden, hidden), (hidden,)
    shapes["pos_embed_input.weight"], shapes["pos_embed_input.bias"] = (hidden, config["in_channels"]), (hidden,)
    for k, size in enumerate(MISTOLINE_KERNELS):
        shapes[f"input_cond_block.encoder.{2 * k}.weight"] = (16, 3 if k == 0 else 16, size, size)
        shapes[f"input_cond_block.encoder.{2 * k}.bias"] = (16,)
    return {k: _value(k, tuple(s)).to(torch.float16).contiguous() for k, s in sorted(shapes.items())}


def write_flux_mistoline(path: Path = FLUX_MISTOLINE) -> Path:
    from safetensors.torch import save_file

    save_file(flux_mistoline_state(), str(path))
    return path


def qwen_instantx_state(mask_values: int = 0) -> dict[str, torch.Tensor]:
    """The tiny InstantX Qwen-Image ControlNet (diffusers' QwenImageControlNetModel names, the layout of
    InstantX/Qwen-Image-ControlNet-Union's file), stored as bf16; RMS-norm scales near 1. ``mask_values=4``: the
    inpainting file's layout (InstantX/Qwen-Image-ControlNet-Inpainting: ``controlnet_x_embedder`` reads 68)."""
    from diffusers import QwenImageControlNetModel

    with torch.device("meta"):
        model = QwenImageControlNetModel(**QWEN_INSTANTX_CONFIG, extra_condition_channels=mask_values)
    out = {}
    for name, tensor in sorted(model.state_dict().items()):
        shape = tuple(tensor.shape)
        value = _value(name, shape)
        if "norm" in name and len(shape) == 1 and name.endswith(".weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
        out[name] = value.to(torch.bfloat16).contiguous()
    return out


def qwen_diffsynth_state(width: int = 32, latent_in: int = 64) -> dict[str, torch.Tensor]:
    """The tiny DiffSynth Qwen-Image ControlNet model patch (DiffSynth-Studio's blockwise ControlNet names:
    ``img_in`` packing the hint latent, per block ``x_rms`` / ``y_rms`` / ``input_proj`` / ``output_proj``), bf16."""
    shapes: dict[str, tuple[int, ...]] = {"img_in.weight": (width, latent_in), "img_in.bias": (width,)}
    for i in range(QWEN_DIFFSYNTH_BLOCKS):
        block = f"controlnet_blocks.{i}."
        shapes[block + "x_rms.weight"] = shapes[block + "y_rms.weight"] = (width,)
        for proj in ("input_proj", "output_proj"):
            shapes[block + proj + ".weight"], shapes[block + proj + ".bias"] = (width, width), (width,)
    out = {}
    for name, shape in sorted(shapes.items()):
        value = _value(name, shape)
        if "_rms." in name:
            value = 1.0 + 0.1 * torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
        out[name] = value.to(torch.bfloat16).contiguous()
    return out


def write_qwen_diffsynth(path: Path = QWEN_DIFFSYNTH) -> Path:
    from safetensors.torch import save_file

    save_file(qwen_diffsynth_state(), str(path))
    return path


def qwen_diffsynth_inpaint_state() -> dict[str, torch.Tensor]:
    """The tiny DiffSynth inpainting patch: as the ControlNet patch, its ``img_in`` packing 17 channels (the
    16-channel latent and one mask channel, 2x2 each: 68 inputs, as DiffSynth's Qwen-Image-Blockwise-ControlNet-
    Inpaint file)."""
    return qwen_diffsynth_state(latent_in=(16 + 1) * 4)


def write_qwen_diffsynth_inpaint(path: Path = QWEN_DIFFSYNTH_INPAINT) -> Path:
    from safetensors.torch import save_file

    save_file(qwen_diffsynth_inpaint_state(), str(path))
    return path


def write_qwen_instantx(path: Path = QWEN_INSTANTX) -> Path:
    from safetensors.torch import save_file

    save_file(qwen_instantx_state(), str(path))
    return path


def write_qwen_instantx_inpaint(path: Path = QWEN_INSTANTX_INPAINT) -> Path:
    from safetensors.torch import save_file

    save_file(qwen_instantx_state(mask_values=4), str(path))
    return path


def write_flux_xlabs(path: Path = FLUX_XLABS) -> Path:
    from safetensors.torch import save_file

    save_file(flux_xlabs_state(), str(path))
    return path


def write_flux_union(path: Path = FLUX_UNION) -> Path:
    from safetensors.torch import save_file

    save_file(flux_union_state(), str(path))
    return path


if __name__ == "__main__":
    sys.exit(
        print(
            write_flux_union(),
            write_flux_xlabs(),
            write_qwen_instantx(),
            write_qwen_diffsynth(),
            write_qwen_diffsynth_inpaint(),
            write_flux_mistoline(),
        )
    )
