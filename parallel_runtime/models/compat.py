"""The one place that touches diffusers internals (names outside its public API).

Everything here may move when diffusers is upgraded; ``tests/test_compat.py`` imports every name
listed in :data:`DIFFUSERS_INTERNALS` and fails with the name, its old place and the installed
version when one moved. diffusers is imported lazily (on call), so importing this module is light.

- attention backends: which backend a processor routes through ``dispatch_attention_fn``
  (sequence parallelism intercepts only torch's ``scaled_dot_product_attention``, which only the
  "native" backend calls);
- attention processor classes by name (the adapters recognise the processors that call it);
- the single-file converters of ``diffusers.loaders.single_file_utils`` (Flux, SD3, Wan and Z-Image
  transformers, LDM-layout VAEs, Wan 2.1 VAEs);
- the XLabs Flux LoRA renamer of ``diffusers.loaders.lora_conversion_utils``;
- the Wan and HunyuanVideo VAEs' layer classes (the parallel video decodes swap their forward for band versions);
- components defined in a pipeline's own module (LTX-2's text connectors, read from single files).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

FLUX_ATTN_PROCESSOR = "FluxAttnProcessor"
JOINT_ATTN_PROCESSOR = "JointAttnProcessor2_0"
ATTN_PROCESSOR = "AttnProcessor2_0"
QWEN_ATTN_PROCESSOR = "QwenDoubleStreamAttnProcessor2_0"
FLUX2_ATTN_PROCESSOR = "Flux2AttnProcessor"
FLUX2_SINGLE_ATTN_PROCESSOR = "Flux2ParallelSelfAttnProcessor"
WAN_ATTN_PROCESSOR = "WanAttnProcessor"
Z_IMAGE_ATTN_PROCESSOR = "ZSingleStreamAttnProcessor"
NATIVE_BACKEND = "native"

_DISPATCH = "diffusers.models.attention_dispatch"
_SINGLE_FILE = "diffusers.loaders.single_file_utils"
_LORA_CONVERSION = "diffusers.loaders.lora_conversion_utils"
_WAN_VAE = "diffusers.models.autoencoders.autoencoder_kl_wan"
_HUNYUAN_VIDEO_VAE = "diffusers.models.autoencoders.autoencoder_kl_hunyuan_video"
_HUNYUAN_VIDEO15_VAE = "diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15"
_LTX_VAE = "diffusers.models.autoencoders.autoencoder_kl_ltx"

DIFFUSERS_INTERNALS: tuple[tuple[str, str, str], ...] = (
    # (module, name, what it is used for)
    (_DISPATCH, "AttentionBackendName", "naming the attention backend a processor routes through"),
    (_DISPATCH, "_AttentionBackendRegistry", "the globally active attention backend"),
    ("diffusers.models.transformers.transformer_flux", FLUX_ATTN_PROCESSOR, "Flux's attention processor"),
    ("diffusers.models.attention_processor", JOINT_ATTN_PROCESSOR, "SD3's joint attention processor"),
    ("diffusers.models.attention_processor", ATTN_PROCESSOR, "PixArt's attention processor"),
    ("diffusers.models.transformers.transformer_qwenimage", QWEN_ATTN_PROCESSOR, "Qwen-Image's attention processor"),
    ("diffusers.models.transformers.transformer_flux2", FLUX2_ATTN_PROCESSOR, "FLUX.2's double-block processor"),
    ("diffusers.models.transformers.transformer_flux2", FLUX2_SINGLE_ATTN_PROCESSOR, "FLUX.2's single-block processor"),
    (_SINGLE_FILE, "convert_flux2_transformer_checkpoint_to_diffusers", "single-file FLUX.2 transformers"),
    ("diffusers.pipelines.flux2.system_messages", "SYSTEM_MESSAGE", "FLUX.2's text-encoder system prompt"),
    (_SINGLE_FILE, "convert_flux_transformer_checkpoint_to_diffusers", "single-file Flux transformers"),
    (_SINGLE_FILE, "convert_sd3_transformer_checkpoint_to_diffusers", "single-file SD3 transformers"),
    (_SINGLE_FILE, "convert_ldm_vae_checkpoint", "VAE files in the original (LDM) layout"),
    (_LORA_CONVERSION, "_convert_xlabs_flux_lora_to_diffusers", "XLabs Flux LoRA files (*.processor.*)"),
    ("diffusers.models.transformers.transformer_wan", WAN_ATTN_PROCESSOR, "Wan's attention processor"),
    (_SINGLE_FILE, "convert_wan_transformer_to_diffusers", "single-file Wan transformers"),
    (_SINGLE_FILE, "convert_wan_vae_to_diffusers", "Wan 2.1 VAE files"),
    (_WAN_VAE, "WanCausalConv3d", "the Wan VAE's causal 3-D convs (band versions in the parallel decode)"),
    (_WAN_VAE, "WanAttentionBlock", "the Wan VAE's mid-block attention (band version in the parallel decode)"),
    (_HUNYUAN_VIDEO_VAE, "HunyuanVideoCausalConv3d", "HunyuanVideo's VAE causal convs (band versions, vae.causal3d)"),
    (_HUNYUAN_VIDEO_VAE, "HunyuanVideoMidBlock3D", "HunyuanVideo's VAE mid block (band version, vae.causal3d)"),
    (_HUNYUAN_VIDEO15_VAE, "HunyuanVideo15CausalConv3d", "HunyuanVideo 1.5's VAE causal convs (vae.causal3d)"),
    (_HUNYUAN_VIDEO15_VAE, "HunyuanVideo15AttnBlock", "HunyuanVideo 1.5's VAE mid-block attention (vae.causal3d)"),
    ("diffusers.models.transformers.transformer_z_image", Z_IMAGE_ATTN_PROCESSOR, "Z-Image's attention processor"),
    (_SINGLE_FILE, "convert_z_image_transformer_checkpoint_to_diffusers", "single-file Z-Image transformers"),
    (_SINGLE_FILE, "convert_ltx_vae_checkpoint_to_diffusers", "LTX-Video VAEs inside Lightricks' checkpoints"),
    (_LTX_VAE, "LTXVideoCausalConv3d", "LTX-Video's VAE convs (band versions, vae.causal3d)"),
)
"""Every diffusers name outside its public API that this module uses."""


def attention_backend(processor: Any) -> str | None:
    """The diffusers attention backend ``processor`` routes through (its own, else the globally
    active one), or None for a processor that calls torch's attention directly."""
    if not hasattr(processor, "_attention_backend"):
        return None
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    backend = processor._attention_backend or _AttentionBackendRegistry.get_active_backend()[0]
    return AttentionBackendName(backend).value


def uses_context_parallel(processor: Any) -> bool:
    """Whether diffusers' own context parallelism is enabled on ``processor``."""
    return getattr(processor, "_parallel_config", None) is not None


def convert_flux_transformer(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of a Black Forest Labs Flux.1 state dict to diffusers names."""
    from diffusers.loaders.single_file_utils import convert_flux_transformer_checkpoint_to_diffusers

    return convert_flux_transformer_checkpoint_to_diffusers(state)


def convert_sd3_transformer(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of a Stability MMDiT (SD3 / SD3.5) state dict to diffusers names."""
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    return convert_sd3_transformer_checkpoint_to_diffusers(state)


def convert_flux2_transformer(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of a Black Forest Labs FLUX.2 state dict to diffusers names."""
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    return convert_flux2_transformer_checkpoint_to_diffusers(state)


def flux2_system_message() -> str:
    """The system message Flux2Pipeline puts before every prompt (Black Forest Labs' own text)."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    return SYSTEM_MESSAGE


def convert_ldm_vae(state: dict[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """diffusers' converter of an original (LDM) VAE state dict to AutoencoderKL names."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(state, dict(config))


def convert_xlabs_flux_lora(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' renamer of an XLabs Flux LoRA (``double_blocks.N.processor.qkv_lora1...``) to PEFT names."""
    from diffusers.loaders.lora_conversion_utils import _convert_xlabs_flux_lora_to_diffusers

    return _convert_xlabs_flux_lora_to_diffusers(state)


def convert_wan_transformer(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of an original Wan (ComfyUI layout) transformer state dict to diffusers names."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    return convert_wan_transformer_to_diffusers(state)


def convert_wan_vae(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of an original Wan 2.1 VAE state dict to AutoencoderKLWan names."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers(state)


def convert_z_image_transformer(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of an original Z-Image (Comfy-Org's repackaged layout) state dict to diffusers names."""
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    return convert_z_image_transformer_checkpoint_to_diffusers(state)


def causal_vae_layer_classes() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(causal 3-D conv classes, attention block classes) of diffusers' Wan-style VAEs: AutoencoderKLWan's
    and AutoencoderKLQwenImage's (the same layers under Qwen-Image's own class names)."""
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageAttentionBlock, QwenImageCausalConv3d
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock, WanCausalConv3d

    return (WanCausalConv3d, QwenImageCausalConv3d), (WanAttentionBlock, QwenImageAttentionBlock)


def convert_ltx_vae(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' converter of a Lightricks LTX-Video VAE (names under ``vae.``) to AutoencoderKLLTXVideo names."""
    from diffusers.loaders.single_file_utils import convert_ltx_vae_checkpoint_to_diffusers

    return convert_ltx_vae_checkpoint_to_diffusers(state)


def ltx_video_vae_conv_class() -> type:
    """LTXVideoCausalConv3d of diffusers' AutoencoderKLLTXVideo."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx import LTXVideoCausalConv3d

    return LTXVideoCausalConv3d


def ltx2_video_vae_conv_class() -> type:
    """LTX2VideoCausalConv3d of diffusers' AutoencoderKLLTX2Video."""
    from diffusers.models.autoencoders.autoencoder_kl_ltx2 import LTX2VideoCausalConv3d

    return LTX2VideoCausalConv3d


def ltx2_text_connectors_class() -> type:
    """LTX2TextConnectors, the text connectors of diffusers' LTX-2 pipeline (defined in the pipeline's module)."""
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    return LTX2TextConnectors


def hunyuan_video_vae_layer_classes() -> tuple[type, type]:
    """(HunyuanVideoCausalConv3d, HunyuanVideoMidBlock3D) of diffusers' AutoencoderKLHunyuanVideo."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (
        HunyuanVideoCausalConv3d,
        HunyuanVideoMidBlock3D,
    )

    return HunyuanVideoCausalConv3d, HunyuanVideoMidBlock3D


def hunyuan_video15_vae_layer_classes() -> tuple[type, type]:
    """(HunyuanVideo15CausalConv3d, HunyuanVideo15AttnBlock) of diffusers' AutoencoderKLHunyuanVideo15."""
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import (
        HunyuanVideo15AttnBlock,
        HunyuanVideo15CausalConv3d,
    )

    return HunyuanVideo15CausalConv3d, HunyuanVideo15AttnBlock
