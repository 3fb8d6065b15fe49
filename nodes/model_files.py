"""Which models the loader offers and where they are: ComfyUI's model folders plus tiny models.

- diffusers folders (with model_index.json) under ``models/diffusers``: offered by their path
  relative to that folder, e.g. ``FLUX.1-dev``;
- single ``.safetensors`` transformer files under ``models/diffusion_models`` (and ``unet``), and GGUF
  transformer files (``.gguf``, ComfyUI-GGUF's) there;
- full checkpoints (``.safetensors`` / ``.sft``; never pickled ``.ckpt``) under ``models/checkpoints``, listed
  after those: the transformer under ``model.diffusion_model.`` with the VAE and text parts beside it, as
  ComfyUI's Load Checkpoint reads them (e.g. ``ltx-2-19b-dev.safetensors``). A name is resolved in
  diffusion_models first, then in checkpoints, so saved workflows keep loading what they loaded; a checkpoint
  whose name is also a diffusion_models file's is listed as ``[checkpoints] <name>`` (resolved in checkpoints
  only), so neither file hides the other;
- the embedded ``tiny-flux-shapes`` (trained: draws the coloured shapes its prompt names, e.g. "a red
  circle on a blue background") and random-weight ``tiny-*`` models of every family (built once locally
  by the pack's ``dit_devtools``) for trying the pack without downloads;
- VAE ``.safetensors`` files under ``models/vae``, for decoding with another VAE than the model's
  own (or at all, for a transformer-only file);
- text-encoder files under ``models/text_encoders`` (Qwen-Image's Qwen2.5-VL, .safetensors or .gguf), for
  Parallel Text Encode;
- image-encoder ``.safetensors`` files under ``models/clip_vision`` (HunyuanVideo 1.5's SigLIP);
- LoRA ``.safetensors`` files under ``models/loras`` (the Parallel LoRA Loader's list);
- ControlNet ``.safetensors`` files under ``models/controlnet`` (the Parallel ControlNet Loader's list).
- Model patch ``.safetensors`` files under ``models/model_patches`` (the Parallel Model Patch Loader's list).
"""

from __future__ import annotations

import os
from pathlib import Path

from parallel_runtime.errors import ConfigError
from parallel_runtime.service.choices import BUILTIN_MODELS

from .bridge import SHIPPED_TOKENIZERS, Bridge

TINY_MODELS: tuple[str, ...] = BUILTIN_MODELS
SINGLE_FILE_SUFFIXES: tuple[str, ...] = (".safetensors", ".sft")
MODEL_FILE_SUFFIXES: tuple[str, ...] = (*SINGLE_FILE_SUFFIXES, ".gguf")  # transformers: also ComfyUI-GGUF's files
VAE_FROM_MODEL = "(the model's own)"
CHECKPOINT_TAG = "[checkpoints] "  # a models/checkpoints file listed under a name a diffusion_models file also has


def _walk(root: str):
    """``os.walk(root, followlinks=True)`` visiting each real folder once: symbolic links are followed
    (models are often linked in from elsewhere) but a link cycle (``a/up -> ..``) is not re-entered."""
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames.clear()
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirnames.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        yield dirpath, dirnames, filenames


def diffusers_folders(bridge: Bridge) -> list[str]:
    found: list[str] = []
    for root in bridge.folder_paths("diffusers"):
        for dirpath, dirnames, filenames in _walk(root):
            if "model_index.json" in filenames:
                found.append(Path(os.path.relpath(dirpath, root)).as_posix())
                dirnames.clear()  # a pipeline's sub-folders are its components, not more models
    return sorted(set(found))


def _files_under(bridge: Bridge, kind: str, suffixes: tuple[str, ...] = SINGLE_FILE_SUFFIXES) -> list[str]:
    """Files ending in ``suffixes`` (safetensors) in ComfyUI's ``kind`` folders, as paths relative to their folder."""
    found: list[str] = []
    for root in bridge.folder_paths(kind):
        for dirpath, _, filenames in _walk(root):
            for name in filenames:
                if name.lower().endswith(suffixes):
                    found.append(Path(os.path.relpath(os.path.join(dirpath, name), root)).as_posix())
    return sorted(set(found))


def single_files(bridge: Bridge) -> list[str]:
    return _files_under(bridge, "diffusion_models", MODEL_FILE_SUFFIXES)


def vae_choices(bridge: Bridge) -> list[str]:
    """The loader's VAE list: the model's own, then the files in models/vae."""
    return [VAE_FROM_MODEL, *_files_under(bridge, "vae")]


def clip_vision_choices(bridge: Bridge) -> list[str]:
    """Image-encoder files in ComfyUI's models/clip_vision folders (HunyuanVideo 1.5's SigLIP)."""
    return _files_under(bridge, "clip_vision")


def resolve_clip_vision(name: str, bridge: Bridge) -> str:
    """The absolute path of the image-encoder file ``name`` (relative to a models/clip_vision folder, or absolute)."""
    return _resolve_in("clip_vision", "vision encoder", name, bridge)


def lora_choices(bridge: Bridge) -> list[str]:
    """The LoRA loader's list: the .safetensors files in ComfyUI's models/loras folders."""
    return _files_under(bridge, "loras")


def resolve_lora(name: str, bridge: Bridge) -> str:
    """The absolute path of the LoRA file ``name`` (relative to a models/loras folder, or absolute)."""
    return _resolve_in("loras", "LoRA", name, bridge)


def _resolve_in(folder: str, what: str, name: str, bridge: Bridge) -> str:
    """The absolute path of ``name`` (relative to one of ComfyUI's ``folder`` folders, or absolute); a
    ConfigError naming the folders searched when there is no such file."""
    name = (name or "").strip()
    for root in bridge.folder_paths(folder):
        candidate = Path(root) / name
        if name and candidate.is_file():
            return str(candidate)
    if os.path.isabs(name) and os.path.isfile(name):
        return name
    raise ConfigError(
        f"{what} {name!r} was not found",
        f"the {what} loader looks for .safetensors files in models/{folder} (searched: "
        + (", ".join(bridge.folder_paths(folder)) or f"no {folder} folder is configured")
        + ")",
        f"put the file there and refresh the page (R), or pick another {what}",
    )


def resolve_vae(name: str, bridge: Bridge) -> str | None:
    """None for the model's own VAE, else the absolute path of the chosen VAE file."""
    name = (name or VAE_FROM_MODEL).strip()
    if name == VAE_FROM_MODEL:
        return None
    for root in bridge.folder_paths("vae"):
        candidate = Path(root) / name
        if candidate.is_file():
            return str(candidate)
    if os.path.isabs(name) and os.path.isfile(name):
        return name
    raise ConfigError(
        f"VAE {name!r} was not found",
        "the loader looks for VAE .safetensors files in models/vae (searched: "
        + (", ".join(bridge.folder_paths("vae")) or "no vae folder is configured")
        + ")",
        f"put the file there and refresh the page (R), or choose {VAE_FROM_MODEL!r}",
    )


def checkpoint_choices(bridge: Bridge) -> list[str]:
    """The full checkpoints in ComfyUI's models/checkpoints folders as the loader lists them: by their relative
    name, or as ``[checkpoints] <name>`` where a diffusion_models file has that name (which the plain name loads)."""
    transformers = set(single_files(bridge))
    return [f"{CHECKPOINT_TAG}{n}" if n in transformers else n for n in _files_under(bridge, "checkpoints")]


def model_choices(bridge: Bridge) -> list[str]:
    """The loader's model list: diffusers folders, single files, full checkpoints, then the tiny models."""
    return [*diffusers_folders(bridge), *single_files(bridge), *checkpoint_choices(bridge), *TINY_MODELS]


def _first_in(bridge: Bridge, kind: str, name: str, files_only: bool) -> str | None:
    for root in bridge.folder_paths(kind):
        candidate = Path(root) / name
        if candidate.is_file() if files_only else candidate.exists():
            return str(candidate)
    return None


def resolve_model(name: str, bridge: Bridge) -> str:
    """What the runtime loads for ``name``: a tiny model name, or an absolute path. A file name is looked up in
    models/diffusion_models, then models/checkpoints; ``[checkpoints] <name>`` in models/checkpoints only."""
    name = name.strip()
    if name in TINY_MODELS:
        return name
    if name.startswith(CHECKPOINT_TAG):
        found = _first_in(bridge, "checkpoints", name[len(CHECKPOINT_TAG) :].strip(), files_only=True)
    elif name.lower().endswith(MODEL_FILE_SUFFIXES):
        found = _first_in(bridge, "diffusion_models", name, files_only=False)
        if found is None and name.lower().endswith(SINGLE_FILE_SUFFIXES):
            found = _first_in(bridge, "checkpoints", name, files_only=True)
    else:
        found = _first_in(bridge, "diffusers", name, files_only=False)
    if found is not None:
        return found
    if os.path.isabs(name) and os.path.exists(name):
        return name
    searched = [p for kind in ("diffusers", "diffusion_models", "checkpoints") for p in bridge.folder_paths(kind)]
    raise ConfigError(
        f"model {name!r} was not found",
        "the loader looks for diffusers folders in models/diffusers, single .safetensors / .gguf transformer "
        "files in models/diffusion_models and models/unet, and full .safetensors checkpoints in models/checkpoints "
        f"(searched: {', '.join(searched) or 'no model folder is configured'})",
        "put the model there and refresh the page (R), pick another model, or try one of " + ", ".join(TINY_MODELS),
    )


TEXT_ENCODER_OWN = "(the model's own)"
TOKENIZER_DIRS = {  # file-name fragment -> ComfyUI's bundled tokenizer (comfy/text_encoders/<name>)
    "qwen": "qwen25_tokenizer",
    "t5xxl": "t5_tokenizer",
    "t5-v1_1": "t5_tokenizer",
    "llava_llama3": "llama_tokenizer",
    "llava-llama-3": "llama_tokenizer",  # llama.cpp GGUFs of it
    "byt5": "byt5_tokenizer",
    "clip_l": "../sd1_tokenizer",  # CLIP's is comfy/sd1_tokenizer, beside comfy/text_encoders
    "clip_g": "../sd1_tokenizer",  # CLIP-G reads the same vocabulary (ComfyUI pads its tokens with 0)
    "llama": "llama_tokenizer",
}
TEXT_ENCODER_NONE = "(none)"


def text_encoder_choices(bridge: Bridge) -> list[str]:
    """Parallel Text Encode's encoder list: the model's own, then the files in models/text_encoders."""
    return [TEXT_ENCODER_OWN, *_files_under(bridge, "text_encoders", MODEL_FILE_SUFFIXES)]


def second_text_encoder_choices(bridge: Bridge) -> list[str]:
    """Parallel Text Encode's second encoder list (Flux.1's CLIP-L): none, then the files in models/text_encoders."""
    return [TEXT_ENCODER_NONE, *_files_under(bridge, "text_encoders", MODEL_FILE_SUFFIXES)]


def resolve_text_encoder(name: str, bridge: Bridge) -> tuple[str, str | None] | None:
    """None for the model's own encoders, else (the file, its tokenizer folder): a folder next to the file
    named ``<file stem>_tokenizer`` or ``tokenizer``, else the one ComfyUI ships for that encoder, else None
    (files such as UMT5's carry their tokenizer; the family's reader says whether one is needed)."""
    name = (name or TEXT_ENCODER_OWN).strip()
    if name in (TEXT_ENCODER_OWN, TEXT_ENCODER_NONE):
        return None
    file = next((Path(r) / name for r in bridge.folder_paths("text_encoders") if (Path(r) / name).is_file()), None)
    if file is None and os.path.isabs(name) and os.path.isfile(name):
        file = Path(name)
    if file is None:
        raise ConfigError(
            f"text encoder {name!r} was not found",
            "Parallel Text Encode reads text-encoder files from models/text_encoders",
            f"put the file there and refresh the page (R), or choose {TEXT_ENCODER_OWN!r}",
        )
    candidates = [file.parent / f"{file.stem}_tokenizer", file.parent / "tokenizer"]
    for root in bridge.folder_paths(SHIPPED_TOKENIZERS):
        candidates += [Path(root) / d for key, d in TOKENIZER_DIRS.items() if key in file.name.lower()]
    tokenizer = next((c for c in candidates if c.is_dir()), None)
    return str(file), None if tokenizer is None else os.path.normpath(tokenizer)


def controlnet_choices(bridge: Bridge) -> list[str]:
    """The .safetensors files in ComfyUI's models/controlnet folders."""
    return _files_under(bridge, "controlnet")


def model_patch_choices(bridge: Bridge) -> list[str]:
    """The .safetensors files in ComfyUI's models/model_patches folders."""
    return _files_under(bridge, "model_patches")


def resolve_model_patch(name: str, bridge: Bridge) -> str:
    """The absolute path of the model patch ``name`` (relative to a models/model_patches folder, or absolute)."""
    return _resolve_in("model_patches", "model patch", name, bridge)


def resolve_controlnet(name: str, bridge: Bridge) -> str:
    """The absolute path of the ControlNet file ``name`` (relative to a models/controlnet folder, or absolute)."""
    return _resolve_in("controlnet", "ControlNet", name, bridge)
