"""Random-weight tiny pipelines of every family (Flux.1, FLUX.2, SD3, PixArt, Qwen-Image, Z-Image, Wan 2.1/2.2,
HunyuanVideo 1.0),
built once per machine from fixed seeds, for tests, benchmarks and trying layouts without downloads.

Light to import: torch, diffusers and transformers load when a model is built.
"""

from .factory import (
    CACHE_ENV,
    TINY_MODELS,
    TINY_VERSION,
    TINY_VIDEO_MODELS,
    WIDENED,
    WIDENED_NAMES,
    build_tiny_pipeline,
    ensure_tiny_model,
    random_prompts,
)

__all__ = [
    "CACHE_ENV",
    "TINY_MODELS",
    "TINY_VERSION",
    "TINY_VIDEO_MODELS",
    "WIDENED",
    "WIDENED_NAMES",
    "build_tiny_pipeline",
    "ensure_tiny_model",
    "random_prompts",
]
