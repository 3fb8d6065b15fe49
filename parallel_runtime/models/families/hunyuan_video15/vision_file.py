"""HunyuanVideo 1.5's image encoder from a file in ``models/clip_vision``: SigLIP's vision tower (the release's
``vision_encoder/siglip``, SigLIP so400m patch14-384; Comfy-Org ships it as ``sigclip_vision_patch14_384.safetensors``,
the file FLUX.1 Redux reads) under transformers' names, with or without the ``vision_model.`` prefix and the
pooling head (the pipeline reads ``last_hidden_state``, the head is not used).

The config is read from the tensors' shapes: width, depth, MLP width, patch and image size; the heads are 72 wide
as so400m's (16 heads of 1152), 64 wide for a width that 72 does not divide (SigLIP base / large), else 8 wide
(the tiny test files). The image goes through transformers' ``SiglipImageProcessor`` at the tower's image size
(bicubic, mean = std = 0.5), as the pipeline's ``feature_extractor``. A HunyuanVideo15ImageToVideoPipeline folder's
own ``image_encoder`` / ``feature_extractor`` are read instead when no file is chosen (``load_folder_encoder``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ....errors import ConfigError

PATCH = "embeddings.patch_embedding.weight"
PREFIX = "vision_model."
WHAT = "SigLIP vision encoder (HunyuanVideo 1.5's image encoder)"
FIX = "pick sigclip_vision_patch14_384.safetensors (Comfy-Org's HunyuanVideo 1.5 / FLUX.1 Redux file) in models/clip_vision"


def _shapes(path: str) -> dict[str, tuple[int, ...]]:
    from ...tensor_files import SafetensorsFile

    if not str(path).lower().endswith(".safetensors"):
        raise ConfigError(f"{Path(path).name} as the {WHAT}", "it is read from a .safetensors file", FIX)
    entries = SafetensorsFile(Path(path)).entries
    return {name.removeprefix(PREFIX): tuple(entry.shape) for name, entry in entries.items()}


def siglip_config(path: str) -> dict[str, Any]:
    """SiglipVisionConfig's arguments for the tower in ``path`` (a ConfigError, on the host, for another file)."""
    shapes = _shapes(path)
    if PATCH not in shapes or "embeddings.position_embedding.weight" not in shapes:
        raise ConfigError(
            f"{Path(path).name} holds no SigLIP vision tower ({PREFIX}{PATCH})",
            f"HunyuanVideo 1.5 image-to-video encodes the start image with the {WHAT}",
            FIX,
        )
    width, _, patch, _ = shapes[PATCH]
    positions = shapes["embeddings.position_embedding.weight"][0]
    layers = 1 + max(int(n.split(".")[2]) for n in shapes if n.startswith("encoder.layers."))
    head_dim = 72 if width % 72 == 0 else 64 if width % 64 == 0 else 8
    return dict(
        hidden_size=width,
        intermediate_size=shapes["encoder.layers.0.mlp.fc1.weight"][0],
        num_hidden_layers=layers,
        num_attention_heads=width // head_dim,
        patch_size=patch,
        image_size=math.isqrt(positions) * patch,
        vision_use_head="head.probe" in shapes,
    )


def load_siglip_file(path: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(SiglipVisionModel, SiglipImageProcessor) of the tower in ``path``, its weights cast to ``dtype``."""
    from safetensors.torch import load_file
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    config = siglip_config(path)
    with torch.device(device):  # built where it runs (its position ids are a buffer the file lacks)
        model = SiglipVisionModel(SiglipVisionConfig(**config)).to(dtype)
    own = model.state_dict()
    prefix = PREFIX if next(iter(own)).startswith(PREFIX) else ""
    weights = {prefix + k.removeprefix(PREFIX): v.to(dtype) for k, v in load_file(path, device=str(device)).items()}
    missing = sorted(set(own) - set(weights))
    if missing:
        raise ConfigError(f"{Path(path).name} lacks {missing[:3]}", f"the {WHAT} needs every tensor", FIX)
    model.load_state_dict({k: weights[k] for k in own})
    size = {"height": config["image_size"], "width": config["image_size"]}
    return model.eval(), SiglipImageProcessor(size=size)


def check_folder_encoder(folder: str | Path) -> None:
    """On the host: the diffusers folder ``folder`` has an image encoder (an image-to-video pipeline's)."""
    folder = Path(folder)
    if not ((folder / "image_encoder" / "config.json").is_file() and (folder / "feature_extractor").is_dir()):
        raise ConfigError(
            f"{folder.name} has no image_encoder / feature_extractor",
            f"with no vision-encoder file chosen, the start image goes through the model folder's own {WHAT} "
            "(a HunyuanVideo15ImageToVideoPipeline folder has one)",
            FIX + ", or load a HunyuanVideo-1.5 i2v diffusers folder",
        )


def load_folder_encoder(folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(SiglipVisionModel, SiglipImageProcessor) of a HunyuanVideo15ImageToVideoPipeline folder."""
    from transformers import SiglipImageProcessor, SiglipVisionModel

    check_folder_encoder(folder)
    model = SiglipVisionModel.from_pretrained(Path(folder) / "image_encoder", dtype=dtype, local_files_only=True)
    processor = SiglipImageProcessor.from_pretrained(Path(folder) / "feature_extractor", local_files_only=True)
    return model.to(device).eval(), processor
