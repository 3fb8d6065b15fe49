"""The ComfyUI face of dit-parallel: node classes and their display names.

Importing this package is light: torch, diffusers and the worker runtime are imported when a
node runs. Only ``bridge.py`` touches ComfyUI itself.
"""

from __future__ import annotations

from .latent import ParallelEmptyLatent
from .loader import ParallelModelLoader
from .lora import ParallelLoraLoader
from .model_sampling import ParallelModelSamplingAuraFlow, ParallelModelSamplingFlux, ParallelModelSamplingSD3
from .sampler import ParallelSampler
from .sampler_advanced import ParallelSamplerAdvanced
from .text_encode import ParallelTextEncode
from .unload import ParallelRuntimeUnload
from .vae_decode import ParallelVAEDecode

NODE_CLASS_MAPPINGS = {
    "DiTParallelModelLoader": ParallelModelLoader,
    "DiTParallelLoraLoader": ParallelLoraLoader,
    "DiTParallelTextEncode": ParallelTextEncode,
    "DiTParallelEmptyLatent": ParallelEmptyLatent,
    "DiTParallelSampler": ParallelSampler,
    "DiTParallelSamplerAdvanced": ParallelSamplerAdvanced,
    "DiTParallelModelSamplingFlux": ParallelModelSamplingFlux,
    "DiTParallelModelSamplingSD3": ParallelModelSamplingSD3,
    "DiTParallelModelSamplingAuraFlow": ParallelModelSamplingAuraFlow,
    "DiTParallelVAEDecode": ParallelVAEDecode,
    "DiTParallelUnload": ParallelRuntimeUnload,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "DiTParallelModelLoader": "Parallel Model Loader",
    "DiTParallelLoraLoader": "Parallel LoRA Loader",
    "DiTParallelTextEncode": "Parallel Text Encode",
    "DiTParallelEmptyLatent": "Parallel Empty Latent",
    "DiTParallelSampler": "Parallel Sampler",
    "DiTParallelSamplerAdvanced": "Parallel Sampler (Advanced)",
    "DiTParallelModelSamplingFlux": "Parallel Model Sampling Flux",
    "DiTParallelModelSamplingSD3": "Parallel Model Sampling SD3",
    "DiTParallelModelSamplingAuraFlow": "Parallel Model Sampling AuraFlow",
    "DiTParallelVAEDecode": "Parallel VAE Decode",
    "DiTParallelUnload": "Parallel Runtime Unload",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
