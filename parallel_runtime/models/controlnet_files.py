"""ControlNet files: which kind a single file is (read from its safetensors header, as ComfyUI 0.3.64's
``load_controlnet_state_dict`` tells them apart by their tensor names) and loading it beside a main model.

Runs today: Flux InstantX / Union files (diffusers' FluxControlNetModel layout: ``controlnet_blocks.N.weight``
and ``controlnet_x_embedder.weight``), XLabs Flux files (Black Forest Labs' ``double_blocks`` beside
``controlnet_blocks.N.weight``), Mistoline Flux files (``controlnet_blocks.N.linear``), and InstantX Qwen-Image
files (diffusers' QwenImageControlNetModel layout: ``transformer_blocks.N.img_mlp`` beside
``controlnet_blocks.N.weight``). The other kinds ComfyUI reads are named in a clear refusal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .controlnet_kind import FLUX_INSTANTX, FLUX_MISTOLINE, FLUX_XLABS, QWEN_DIFFSYNTH, QWEN_INSTANTX, ControlNetFile
from .safetensors_header import read_header

_OTHER_KINDS = (  # (a tensor only that kind has, what it is), in ComfyUI's order of tests
    ("after_proj_list.18.bias", "a Hunyuan-DiT ControlNet"),
    ("lora_controlnet", "a Control-LoRA (SDXL)"),
    ("controlnet_cond_embedding.conv_in.weight", "a UNet ControlNet (SD1.x / SDXL, diffusers layout)"),
    ("double_blocks.0.img_attn.norm.key_norm.scale", "an XLabs Flux ControlNet"),
    ("pos_embed_input.proj.weight", "an SD3 / SD3.5 ControlNet"),
    ("transformer_blocks.0.img_mlp.net.0.proj.weight", "an InstantX Qwen-Image ControlNet"),
    ("zero_convs.0.0.weight", "a UNet ControlNet (SD1.x / SDXL)"),
    ("control_model.zero_convs.0.0.weight", "a UNet ControlNet (SD1.x / SDXL)"),
)


def describe_controlnet(path: str | Path) -> ControlNetFile:
    """The kind of the ControlNet file at ``path``, or a ConfigError naming what it is and what runs."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"ControlNet file {path} not found",
            "ControlNets are read from single files (ComfyUI's models/controlnet folder)",
            "pick a file that exists in models/controlnet",
        )
    if path.suffix not in (".safetensors", ".sft"):
        raise ConfigError(
            f"ControlNet file {path.name} is not a .safetensors file",
            "the workers read ControlNet weights from safetensors files only (no pickled checkpoints)",
            "use the .safetensors release of this ControlNet",
        )
    header = read_header(path)
    shapes = {k: v["shape"] for k, v in header.items() if isinstance(v, dict) and "shape" in v}
    if (
        "controlnet_blocks.0.weight" in shapes
        and "controlnet_x_embedder.weight" in shapes
        and not any(k in shapes for k, _ in _OTHER_KINDS[3:6])
    ):
        from .families.flux.controlnet import describe_instantx

        return describe_instantx(path, shapes)
    if "controlnet_blocks.0.weight" in shapes and "double_blocks.0.img_attn.norm.key_norm.scale" in shapes:
        from .families.flux.controlnet_xlabs import describe_xlabs

        return describe_xlabs(path, shapes)
    if "controlnet_blocks.0.weight" in shapes and "transformer_blocks.0.img_mlp.net.0.proj.weight" in shapes:
        from .families.qwen_image.controlnet import describe_qwen_instantx

        return describe_qwen_instantx(path, shapes)
    if "controlnet_blocks.0.linear.weight" in shapes and "controlnet_blocks.0.weight" not in shapes:  # Mistoline
        from .families.flux.controlnet_mistoline import describe_mistoline

        return describe_mistoline(path, shapes)
    if "controlnet_blocks.0.y_rms.weight" in shapes:  # a DiffSynth Qwen-Image model patch (ModelPatchLoader's test)
        from .families.qwen_image.diffsynth import describe_diffsynth

        return describe_diffsynth(path, shapes)
    what = next((w for k, w in _OTHER_KINDS if k in shapes), "not a ControlNet kind ComfyUI 0.3.64 detects")
    raise ConfigError(
        f"ControlNet file {path.name} is {what}",
        "the Parallel Sampler runs Flux ControlNets of the InstantX / Union layout (diffusers' FluxControlNetModel "
        "file), XLabs and Mistoline Flux ControlNets and InstantX Qwen-Image ControlNets so far",
        "use a Flux InstantX / Union or XLabs ControlNet (e.g. FLUX.1-dev-ControlNet-Union), an InstantX "
        "Qwen-Image ControlNet, or ComfyUI's own KSampler for this ControlNet",
    )


def load_controlnet(info: ControlNetFile, main: Any) -> Any:
    """The family's ControlNet runner for ``info`` beside the main model's adapter ``main`` (on its device
    and dtype)."""
    if info.kind == FLUX_INSTANTX:
        from .families.flux.controlnet import FluxControlNet

        return FluxControlNet.load(info.path, main)
    if info.kind == FLUX_XLABS:
        from .families.flux.controlnet_xlabs import XLabsFluxControlNet

        return XLabsFluxControlNet.load(info.path, main)
    if info.kind == FLUX_MISTOLINE:
        from .families.flux.controlnet_mistoline import MistolineFluxControlNet

        return MistolineFluxControlNet.load(info.path, main)
    if info.kind == QWEN_INSTANTX:
        from .families.qwen_image.controlnet import QwenImageControlNet

        return QwenImageControlNet.load(info.path, main)
    if info.kind == QWEN_DIFFSYNTH:
        from .families.qwen_image.diffsynth import QwenDiffSynthPatch

        return QwenDiffSynthPatch.load(info.path, main)
    raise ConfigError(
        f"ControlNet kind {info.kind!r}", "no runner for it", "use a Flux InstantX / Union or XLabs ControlNet"
    )
