"""The built-in models a loader offers by name, for trying the pack without downloads.

``tiny-flux-shapes`` is trained (it draws the coloured shapes its prompt names) and ships with the
package under ``trained/``. The random-weight ``tiny-*`` models of every family are built once per
machine by the checkout's ``dit_devtools.tiny`` (not installed with the package; see
:mod:`parallel_runtime.checkout`). Importing this module is light.
"""

from __future__ import annotations

from pathlib import Path

from ..checkout import devtools_module
from ..errors import ConfigError

TRAINED_MODELS: tuple[str, ...] = ("tiny-flux-shapes",)
RANDOM_MODELS: tuple[str, ...] = (
    "tiny-flux",
    "tiny-sd3",
    "tiny-pixart",
    "tiny-qwen-image",
    "tiny-flux2",
    "tiny-z-image",
    "tiny-chroma",
    "tiny-wan",
    "tiny-wan-i2v",
    "tiny-wan-a14b",
    "tiny-wan-ti2v",
    "tiny-hunyuan-video",
    "tiny-hunyuan-video-i2v",
    "tiny-hunyuan-video-1.5",
    "tiny-ltx-video",
    "tiny-ltx2",
)  # dit_devtools.tiny's TINY_MODELS + TINY_VIDEO_MODELS
BUILTIN_MODELS: tuple[str, ...] = (*TRAINED_MODELS, *RANDOM_MODELS)
TRAINED_ROOT = Path(__file__).resolve().parent / "trained"


def builtin_model_path(name: str) -> Path:
    """Folder of the built-in model ``name``: the trained one shipped in the package, or a random-weight
    one built once from the checkout's ``dit_devtools.tiny``."""
    if name in RANDOM_MODELS:
        return devtools_module("tiny", f"the random-weight test model {name!r}").ensure_tiny_model(name)
    if name not in TRAINED_MODELS:
        raise ConfigError(
            f"{name!r} is not a built-in model",
            "built-in models are offered by name; anything else is read from disk",
            f"use one of {', '.join(BUILTIN_MODELS)}, or a path to a diffusers folder or a .safetensors file",
        )
    path = TRAINED_ROOT / name
    if not (path / "model_index.json").is_file():
        raise ConfigError(
            f"the built-in model {name!r} is missing from {path}",
            "its weights are package data of parallel_runtime.models (trained/...), installed with the package",
            "reinstall the package (pip install .), or use a model from disk",
        )
    return path
