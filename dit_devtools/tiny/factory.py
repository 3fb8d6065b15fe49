"""Build the random-weight tiny pipelines by name, once per machine, for tests and benchmarks.

Each is a complete diffusers folder (model_index.json, safetensors weights, real tokenizer files) that
``FluxPipeline.from_pretrained`` etc. load, built from configs with a fixed seed so that every machine
builds the same weights. The engine offers them by name (``parallel_runtime.models.builtin``) and builds
them here, from the checkout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from parallel_runtime.errors import ConfigError

TINY_VERSION = "v1"  # bump whenever the built folders change: caches are keyed by it
TINY_MODELS: tuple[str, ...] = (
    "tiny-flux",
    "tiny-sd3",
    "tiny-pixart",
    "tiny-qwen-image",
    "tiny-flux2",
    "tiny-z-image",
    "tiny-chroma",
)
TINY_VIDEO_MODELS: tuple[str, ...] = (
    "tiny-wan",
    "tiny-wan-i2v",
    "tiny-wan-a14b",
    "tiny-wan-ti2v",
    "tiny-hunyuan-video",
    "tiny-hunyuan-video-i2v",
    "tiny-hunyuan-video-1.5",
    "tiny-ltx-video",
    "tiny-ltx2",
)
# Models without text encoders (their conditioning comes from ComfyUI's encoders): for tests, not built-ins.
TINY_CONDITIONED_MODELS: tuple[str, ...] = ("tiny-hidream",)
CACHE_ENV = "DIT_PARALLEL_TINY_ROOT"
# Widened tiny models for speed measurements (``bench families``): 512 wide (8 heads x 64), a few blocks; the text
# widths stay tied to the tiny text encoders.
WIDENED: dict[str, dict[str, Any]] = {
    "tiny-flux": dict(num_attention_heads=8, attention_head_dim=64, num_layers=2, num_single_layers=2),
    "tiny-flux2": dict(num_attention_heads=8, attention_head_dim=64, axes_dims_rope=(16, 16, 16, 16)),
    "tiny-qwen-image": dict(num_attention_heads=8, attention_head_dim=64, num_layers=4, axes_dims_rope=(16, 24, 24)),
    "tiny-pixart": dict(num_attention_heads=8, attention_head_dim=72, num_layers=4),  # width divisible by 3
    "tiny-wan": dict(num_attention_heads=8, attention_head_dim=64, num_layers=4, ffn_dim=2048),
    "tiny-z-image": dict(dim=512, n_heads=8, n_kv_heads=8, axes_dims=[16, 24, 24], n_layers=4, n_refiner_layers=2),
    "tiny-chroma": dict(num_attention_heads=8, attention_head_dim=64, axes_dims_rope=(16, 24, 24)),
    "tiny-sd3": dict(num_attention_heads=8, attention_head_dim=64, num_layers=4, pos_embed_max_size=64),
    "tiny-hunyuan-video": dict(num_attention_heads=8, attention_head_dim=64, rope_axes_dim=(16, 24, 24)),
    "tiny-hunyuan-video-1.5": dict(
        num_attention_heads=8, attention_head_dim=64, num_layers=4, rope_axes_dim=(16, 24, 24)
    ),
    "tiny-ltx-video": dict(num_attention_heads=8, attention_head_dim=64, cross_attention_dim=512, num_layers=4),
    "tiny-hidream": dict(num_attention_heads=8, attention_head_dim=64, axes_dims_rope=(32, 16, 16)),
    "tiny-ltx2": dict(num_attention_heads=8, attention_head_dim=64, cross_attention_dim=512, num_layers=4),
}


WIDENED_NAMES: dict[str, str] = {"hidream-i1": "tiny-hidream"}  # family id -> its tiny model, where not tiny-<id>


def random_prompts(name: str):
    """(positive, negative) random conditionings for the tiny ``name`` widened by ``WIDENED[name]``, for a model
    whose prompts no worker encodes (HiDream-I1's come from ComfyUI's encoders); None for the others."""
    from .hidream import RANDOM_PROMPTS

    make = RANDOM_PROMPTS.get(name)
    return None if make is None else make(WIDENED[name])


def _builders() -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    from . import big, chroma, hidream, hunyuan_video, hunyuan_video15, image, ltx2, ltx_video, video, z_image

    builders = {**image.BUILDERS, "tiny-qwen-image": big.qwen_image, "tiny-flux2": big.flux2, **video.BUILDERS}
    return {
        **builders,
        **hunyuan_video.BUILDERS,
        **hunyuan_video15.BUILDERS,
        **ltx_video.BUILDERS,
        "tiny-z-image": z_image.z_image,
        **chroma.BUILDERS,
        **hidream.BUILDERS,
        **ltx2.BUILDERS,
    }


def _check_name(name: str) -> None:
    if name not in (*TINY_MODELS, *TINY_VIDEO_MODELS, *TINY_CONDITIONED_MODELS):
        raise ConfigError(
            f"unknown tiny model {name!r}",
            "tiny models are built from the configs in dit_devtools.tiny",
            f"use one of: {', '.join((*TINY_MODELS, *TINY_VIDEO_MODELS))}",
        )


def build_tiny_pipeline(name: str, dest: str | os.PathLike, **transformer_overrides: Any) -> Path:
    """Build the tiny pipeline ``name`` into the folder ``dest`` (created; must not hold a model).

    ``transformer_overrides`` replace entries of the transformer config, e.g. ``num_layers=8,
    num_attention_heads=8`` for a deeper/wider benchmark variant (text dimensions stay tied to the
    tiny text encoders)."""
    _check_name(name)
    parts = _builders()[name](dict(transformer_overrides))
    pipeline_cls = parts.pop("cls")
    pipe = pipeline_cls(**parts)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(dest, safe_serialization=True)
    return dest


def default_root() -> Path:
    """Cache root: $DIT_PARALLEL_TINY_ROOT, else ~/.cache/dit-parallel/tiny."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dit-parallel" / "tiny"


def ensure_tiny_model(name: str, root: str | os.PathLike | None = None) -> Path:
    """Path of the tiny pipeline ``name``, building it once (atomically) under ``root``.

    Concurrent callers are safe: each builds into a private temporary folder and renames it into
    place; the first rename wins and the others discard their copy. (Threads of one process that
    build at the same moment share torch's global RNG, so the winner's weights may then differ from
    the seeded ones; separate processes always build identical folders.)"""
    _check_name(name)
    root = Path(root) if root is not None else default_root()
    final = root / f"{name}-{TINY_VERSION}"
    if (final / "model_index.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-build-", dir=root))
    try:
        build_tiny_pipeline(name, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "model_index.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
