"""Facts about model files read without loading weights: safetensors headers, the family of a
transformer from its tensor names, and the layout planner's :class:`ModelInfo` of a model."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..parallel.layout import ModelInfo

DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
_HEAD_DIM = {
    "flux": 128,
    "sd3": 64,
    "pixart": 72,
    "qwen-image": 128,
    "flux2": 128,
    "wan": 128,
}  # typical head dim per family (heads of a single file)


def model_info_from_path(
    path: str | os.PathLike, family: str | None = None, dtype: str = "bf16", storage: str = "auto"
) -> ModelInfo:
    """The planner's facts about a diffusers folder (model_index.json + transformer/) or a single
    .safetensors transformer file, read from configs and tensor headers (no weights are loaded).
    Weight bytes are those each block will hold (``dtype``; fp8 layers kept as ``storage`` says)."""
    path = Path(path).expanduser()
    run_bytes = DTYPE_BYTES.get(dtype)
    if run_bytes is None:
        raise ConfigError(
            f"unknown dtype {dtype!r}", "weights are held in one float type", f"use one of {list(DTYPE_BYTES)}"
        )
    if path.is_dir():
        return _with_budget(_from_diffusers_folder(path, run_bytes), path, run_bytes, storage)
    if path.is_file() and path.suffix == ".safetensors":
        return _with_budget(_from_single_file(path, family, run_bytes), path, run_bytes, storage)
    raise ConfigError(
        f"model {path} does not exist" if not path.exists() else f"model {path} is not a folder or .safetensors file",
        "a model is a diffusers folder (with model_index.json) or a single .safetensors transformer file",
        "pick a folder under models/diffusers or a file under models/diffusion_models",
    )


def _from_diffusers_folder(path: Path, run_bytes: int) -> ModelInfo:
    cfg_file = path / "transformer" / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(
            f"{path} has no transformer/config.json",
            "the planner reads the transformer's head count and depth from its config",
            "point at the top folder of a diffusers pipeline (the one holding model_index.json)",
        )
    config = json.loads(cfg_file.read_text(encoding="utf-8"))
    cls_name = config.get("_class_name", "")
    family = {
        "FluxTransformer2DModel": "flux",
        "SD3Transformer2DModel": "sd3",
        "PixArtTransformer2DModel": "pixart",
        "QwenImageTransformer2DModel": "qwen-image",
        "Flux2Transformer2DModel": "flux2",
        "WanTransformer3DModel": "wan",
    }.get(cls_name)
    if family is None:
        raise ConfigError(
            f"{path} holds a {cls_name or 'unknown'} transformer",
            "only Flux, FLUX.2, Qwen-Image, SD3, PixArt and Wan transformers have parallel adapters",
            "use a FLUX.1, FLUX.2, Qwen-Image, SD3/3.5, PixArt-alpha/sigma or Wan 2.1/2.2 diffusers folder",
        )
    heads = int(config["num_attention_heads"])
    layers = int(config.get("num_layers", 0)) + int(config.get("num_single_layers", 0))
    hidden = heads * int(config["attention_head_dim"])
    params = sum(_safetensors_params(f) for f in sorted((path / "transformer").glob("*.safetensors")))
    if family == "wan":  # both experts of a two-expert pipeline are held
        params += sum(_safetensors_params(f) for f in sorted((path / "transformer_2").glob("*.safetensors")))
        return video_model_info(
            family, heads, layers, hidden, params * run_bytes, int(config.get("out_channels") or 16)
        )
    return ModelInfo(family, heads, layers, hidden, params * run_bytes)


def _with_budget(info: ModelInfo, path: Path, run_bytes: int, storage: str) -> ModelInfo:
    """``info`` with the bytes each block, the embedding and the output layers will hold (from the model's
    config on "meta"; fp8 tensors of a single file counted as kept). Unreadable configs keep the estimate."""
    import dataclasses

    import diffusers

    from .weight_budget import weight_budget

    if path.is_dir() and (path / "transformer_2").is_dir():
        return info  # two experts (Wan 2.2 A14B): weight_bytes counts both; a per-block budget would count one
    try:
        if path.is_dir():
            config = json.loads((path / "transformer" / "config.json").read_text(encoding="utf-8"))
            fp8: frozenset[str] = frozenset()
        else:
            from .single_file import inspect_single_file, single_file_tensor_source

            config = dict(inspect_single_file(path, info.family).config)
            fp8 = frozenset(single_file_tensor_source(path, info.family)[2].fp8)
        budget = weight_budget(getattr(diffusers, str(config["_class_name"])), config, run_bytes, fp8, storage)
    except ConfigError:
        return info  # e.g. a header-only file: the planner spreads weight_bytes evenly over the blocks
    if len(budget.blocks) != info.num_layers:
        return info
    heads = int(config.get("num_attention_heads") or info.num_heads)
    return dataclasses.replace(
        info,
        num_heads=heads,
        hidden_size=heads * int(config.get("attention_head_dim") or info.hidden_size // heads),
        weight_bytes=budget.total,
        block_bytes=budget.blocks,
        embed_bytes=budget.embed,
        final_bytes=budget.final,
    )


def video_model_info(family: str, heads: int, layers: int, hidden: int, weight_bytes: int, channels: int) -> ModelInfo:
    """A Wan model's planner facts: 4 frames per latent frame, 16 px per token (32 for the 48-channel
    TI2V-5B, whose VAE compresses 16x)."""
    return ModelInfo(
        family, heads, layers, hidden, weight_bytes, token_pixels=32 if channels == 48 else 16, frames_per_latent=4
    )


def read_safetensors_header(file: str | os.PathLike) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", ...} from a .safetensors header (reads only the header)."""
    from .tensor_files import read_header

    return read_header(file)[0]


def _safetensors_params(file: Path) -> int:
    return sum(math.prod(v.get("shape", [])) for v in read_safetensors_header(file).values())


_FAMILY_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (family, key fragments: any one present identifies it; checked in this order)
    ("flux2", ("double_stream_modulation_img.",)),  # before flux: FLUX.2 has double/single blocks too
    ("qwen-image", ("txt_norm.weight",)),
    ("flux", ("double_blocks.", "single_transformer_blocks.", "single_blocks.")),
    ("sd3", ("joint_blocks.", "context_embedder.weight", "transformer_blocks.0.ff_context")),
    ("pixart", ("adaln_single.", "t_block.", "y_embedder.", "caption_projection.")),
    ("wan", ("head.modulation", "condition_embedder.time_proj.")),
)


def detect_family(keys: Iterable[str]) -> str | None:
    """Family of a transformer state dict from its tensor names (diffusers or original layout)."""
    keys = list(keys)
    for family, markers in _FAMILY_MARKERS:
        if any(m in k for k in keys for m in markers):
            return family
    return None


def _count_blocks(keys: Iterable[str], prefixes: Sequence[str]) -> int:
    total = 0
    for prefix in prefixes:
        idx = {k[len(prefix) :].split(".", 1)[0] for k in keys if k.startswith(prefix)}
        total += len({i for i in idx if i.isdigit()})
    return total


def _from_single_file(path: Path, family: str | None, run_bytes: int) -> ModelInfo:
    header = read_safetensors_header(path)
    keys = [k.removeprefix("model.diffusion_model.") for k in header]
    found = detect_family(keys)
    if found is None:
        raise ConfigError(
            f"{path.name} does not look like a Flux, FLUX.2, Qwen-Image, SD3, PixArt or Wan transformer",
            "its tensor names match none of the supported families (is it a full checkpoint, a LoRA or a VAE?)",
            "use a transformer-only file (models/diffusion_models) of a supported family, or a diffusers folder",
        )
    if family is not None and family != found:
        raise ConfigError(
            f"{path.name} is a {found} transformer but family {family!r} was chosen",
            "the family decides which adapter splits the model; a wrong one cannot load the weights",
            f"set family to {found!r} (or 'auto')",
        )
    layers = _count_blocks(
        keys,
        (
            "double_blocks.",
            "single_blocks.",
            "transformer_blocks.",
            "single_transformer_blocks.",
            "joint_blocks.",
            "blocks.",
        ),
    )
    hidden = _hidden_size(header, found)
    params = sum(math.prod(v.get("shape", [])) for v in header.values())
    heads = max(hidden // _HEAD_DIM[found], 1)
    if found == "wan":
        out = header.get("head.head.weight", header.get("model.diffusion_model.head.head.weight", {}))
        channels = int(out.get("shape", [64])[0]) // 4
        return video_model_info(found, heads, layers, hidden, params * run_bytes, channels)
    return ModelInfo(found, heads, layers, hidden, params * run_bytes)


def _hidden_size(header: Mapping[str, dict], family: str) -> int:
    for key, value in header.items():
        k = key.removeprefix("model.diffusion_model.")
        if k in (
            "img_in.weight",
            "x_embedder.proj.weight",
            "pos_embed.proj.weight",
            "x_embedder.weight",
            "patch_embedding.weight",
        ):
            return int(value["shape"][0])
    return _HEAD_DIM[family] * 24
