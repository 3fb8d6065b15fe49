"""The ComfyUI face of dit-parallel: node classes and their display names.

Each node is declared once (``declare.NodeSpec``) and registered in the form the running ComfyUI understands
(``public_form``: its versioned public API where that works, the classic form otherwise). Importing this
package is light: torch, diffusers and the worker runtime are imported when a node runs. Only the bridge
(``bridge.py`` and its hooks) touches ComfyUI itself.
"""

from __future__ import annotations

from .caches import ParallelBlockCache, ParallelEasyCache, ParallelLazyCache
from .context import shared_bridge
from .controlnet import ParallelControlNetLoader
from .image_to_video import ParallelHunyuanVideo15ImageToVideo
from .latent import ParallelEmptyLatent
from .loader import ParallelModelLoader
from .lora import ParallelLoraLoader
from .model_patch import ParallelModelPatchLoader, ParallelQwenImageDiffsynthControlnet
from .model_sampling import ParallelModelSamplingAuraFlow, ParallelModelSamplingFlux, ParallelModelSamplingSD3
from .public_form import node_classes
from .sampler import ParallelSampler
from .sampler_advanced import ParallelSamplerAdvanced
from .text_encode import ParallelTextEncode, ParallelTextEncodeHunyuanVideoImageToVideo
from .text_encode_edit import ParallelTextEncodeQwenImageEdit, ParallelTextEncodeQwenImageEditPlus
from .unload import ParallelRuntimeUnload
from .vae_decode import ParallelVAEDecode

NODES = [
    ParallelModelLoader,
    ParallelLoraLoader,
    ParallelControlNetLoader,
    ParallelModelPatchLoader,
    ParallelQwenImageDiffsynthControlnet,
    ParallelTextEncode,
    ParallelTextEncodeQwenImageEdit,
    ParallelTextEncodeQwenImageEditPlus,
    ParallelTextEncodeHunyuanVideoImageToVideo,
    ParallelEmptyLatent,
    ParallelHunyuanVideo15ImageToVideo,
    ParallelSampler,
    ParallelSamplerAdvanced,
    ParallelModelSamplingFlux,
    ParallelModelSamplingSD3,
    ParallelModelSamplingAuraFlow,
    ParallelEasyCache,
    ParallelLazyCache,
    ParallelBlockCache,
    ParallelVAEDecode,
    ParallelRuntimeUnload,
]

NODE_CLASS_MAPPINGS, NODE_FORM = node_classes(NODES, shared_bridge())
NODE_DISPLAY_NAME_MAPPINGS = {node.SPEC.node_id: node.SPEC.display_name for node in NODES}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
