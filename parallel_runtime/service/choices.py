"""The choices and limits a graph's inputs take: the node declarations read them, the service's checks
(``input_checks``, ``load_plan``, ``comfy_graph``) enforce them. Each is written once, here.

The numeric limits are ComfyUI's own input limits (KSampler: steps <= 10,000, seed < 2**64; latents: side
<= 16,384 px, batch <= 4,096; ...), so any graph ComfyUI accepts passes. Light to import (no torch): ComfyUI
imports every node pack at its start.
"""

from __future__ import annotations

from ..models.builtin import BUILTIN_MODELS

__all__ = ["BUILTIN_MODELS"]

# sampling (KSampler / KSamplerAdvanced)
MAX_STEPS = 10_000
SEED_LIMIT = 2**64
SEED_MAX = SEED_LIMIT - 1
MAX_SCHEDULE = 1_000_000  # steps / denoise: ComfyUI's extreme is 10,000 steps at denoise 0.01
MAX_SIGMAS = MAX_STEPS + 1
MAX_CFG = 100.0
MAX_GUIDANCE = 100.0  # FluxGuidance
DEFAULT_GUIDANCE = 3.5  # what KSampler embeds for a Flux entry without FluxGuidance
ENABLE_DISABLE = ("enable", "disable")  # KSamplerAdvanced's add_noise / return_with_leftover_noise

# latents (EmptyLatentImage / EmptyHunyuanLatentVideo)
MAX_SIDE = 16_384
MIN_SIDE = 16
SIZE_STEP = 8  # the VAE's factor: sides in steps of 8 px
MAX_BATCH = 4_096
MAX_FRAMES = MAX_SIDE  # a video's length (ComfyUI's MAX_RESOLUTION)
FRAME_STEP = 4  # a Wan latent frame holds 4 video frames (after the first)

# model patches (ModelSampling* / LoraLoaderModelOnly)
MAX_SHIFT = 100.0
LORA_STRENGTH_LIMIT = 100.0  # -100 .. 100

# the loader
LAYOUTS = ("auto", "manual")
DTYPES = ("bf16", "fp16", "fp32")
ATTENTION = ("auto", "sdpa", "flash", "flash3", "sage", "cudnn")
COMPILE = ("off", "blocks")  # compiled blocks (models.compiled_blocks)
FP8_MATMUL = ("auto", "upcast")  # how fp8 layers multiply (models.fp8_matmul)
WEIGHTS = {"as file": "auto", "fp8_e4m3fn": "fp8_e4m3fn", "convert to dtype": "compute"}  # choice -> storage
DEQUANT_DTYPES = ("default", "target", "float32", "float16", "bfloat16")  # UnetLoaderGGUFAdvanced's choices
MAX_DEGREE = 64
MAX_CFG_DEGREE = 2  # two branches: positive and negative
MAX_PP_PATCHES = 256
MAX_PP_WARMUP = 100
