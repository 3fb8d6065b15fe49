"""The layout planner's :class:`ModelInfo` of a model, read from its files (configs and tensor headers; no
weights are loaded), with each family's hints (``FamilySpec.layout``, ``head_dim``, ``geometry``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from ..parallel.layout import ModelInfo
from .families.registry import confirm_family, family, family_of_class_name, labels
from .files import detect_family, read_safetensors_header

DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
_BLOCK_PREFIXES = (
    "double_blocks.",
    "single_blocks.",
    "transformer_blocks.",
    "single_transformer_blocks.",
    "joint_blocks.",
    "blocks.",
)
_WIDTH_KEYS = (
    "img_in.weight",
    "x_embedder.proj.weight",
    "pos_embed.proj.weight",
    "x_embedder.weight",
    "patch_embedding.weight",
)  # a tensor whose first dim is the transformer's width, in one family's layout or another


def model_info_from_path(
    path: str | os.PathLike, family: str | None = None, dtype: str = "bf16", storage: str = "auto"
) -> ModelInfo:
    """The planner's facts about a diffusers folder (model_index.json + transformer/) or a single
    .safetensors / .gguf transformer file, read from configs and tensor headers (no weights are loaded).
    Weight bytes are those each block will hold (``dtype``; fp8 layers kept as ``storage`` says, GGUF
    weights in their GGML blocks)."""
    path = Path(path).expanduser()
    run_bytes = DTYPE_BYTES.get(dtype)
    if run_bytes is None:
        raise ConfigError(
            f"unknown dtype {dtype!r}", "weights are held in one float type", f"use one of {list(DTYPE_BYTES)}"
        )
    if path.is_dir():
        return _with_budget(_from_diffusers_folder(path, family, run_bytes), path, run_bytes, storage)
    if path.is_file() and path.suffix.lower() == ".gguf":
        from .gguf.model_file import check_gguf_request

        check_gguf_request(storage, "default")  # no fp8 storage of a GGUF's weights
    if path.is_file() and path.suffix.lower() in (".safetensors", ".gguf"):
        return _with_budget(_from_single_file(path, family, run_bytes), path, run_bytes, storage)
    raise ConfigError(
        f"model {path} does not exist" if not path.exists() else f"model {path} is not a folder or .safetensors file",
        "a model is a diffusers folder (with model_index.json) or a single .safetensors transformer file",
        "pick a folder under models/diffusers or a file under models/diffusion_models",
    )


def family_model_info(
    family_id: str, heads: int, layers: int, hidden: int, weight_bytes: int, channels: int | None = None
) -> ModelInfo:
    """A ModelInfo with the family's hints: its usual CFG scale and text tokens, and the pixels per token and
    frames per latent frame of a latent of ``channels`` (e.g. Wan: 4 frames, 32 px for the 48-channel TI2V-5B)."""
    spec = family(family_id)
    token_pixels, frames = spec.geometry(channels)
    return ModelInfo(
        family_id,
        heads,
        layers,
        hidden,
        weight_bytes,
        token_pixels=token_pixels,
        frames_per_latent=frames,
        hints=spec.layout,
    )


def _from_diffusers_folder(path: Path, family_id: str | None, run_bytes: int) -> ModelInfo:
    cfg_file = path / "transformer" / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(
            f"{path} has no transformer/config.json",
            "the planner reads the transformer's head count and depth from its config",
            "point at the top folder of a diffusers pipeline (the one holding model_index.json)",
        )
    config = json.loads(cfg_file.read_text(encoding="utf-8"))
    cls_name = config.get("_class_name", "")
    spec = family_of_class_name(cls_name)
    if spec is None:
        raise ConfigError(
            f"{path} holds a {cls_name or 'unknown'} transformer",
            f"only {labels('and')} transformers have parallel adapters",
            f"use a diffusers folder of one of those families ({labels()})",
        )
    confirm_family(path.name, spec.id, family_id)
    sizes = spec.adapter().config_sizes(config)
    heads, layers, hidden = sizes.heads, sizes.blocks, sizes.hidden
    params = sum(_safetensors_params(f) for f in sorted((path / "transformer").glob("*.safetensors")))
    # both experts of a two-expert pipeline (Wan 2.2 A14B) are held
    params += sum(_safetensors_params(f) for f in sorted((path / "transformer_2").glob("*.safetensors")))
    channels = config.get("out_channels")
    return family_model_info(spec.id, heads, layers, hidden, params * run_bytes, channels and int(channels))


def _with_budget(info: ModelInfo, path: Path, run_bytes: int, storage: str) -> ModelInfo:
    """``info`` with the bytes each block, the embedding and the output layers will hold (from the model's
    config on "meta"; fp8 tensors of a single file counted as kept). Unreadable configs keep the estimate."""
    from .registry import diffusers_class
    from .single_file import inspect_single_file, single_file_tensor_source
    from .weight_budget import weight_budget

    if path.is_dir() and (path / "transformer_2").is_dir():
        return info  # two experts (Wan 2.2 A14B): weight_bytes counts both; a per-block budget would count one
    source = None
    try:
        if path.is_dir():
            config = json.loads((path / "transformer" / "config.json").read_text(encoding="utf-8"))
            fp8: frozenset[str] = frozenset()
        else:
            config = dict(inspect_single_file(path, info.family).config)
            source = single_file_tensor_source(path, info.family)[2]
            fp8 = frozenset(source.fp8)
        cls = diffusers_class(str(config["_class_name"]))
        budget = weight_budget(cls, config, run_bytes, fp8, storage, source if source and source.ggml else None)
    except ConfigError:
        if path.suffix.lower() == ".gguf":
            raise  # a GGUF's bytes are its blocks': an estimate from parameter counts would be far off
        return info  # e.g. a header-only file: the planner spreads weight_bytes evenly over the blocks
    sizes = family(info.family).adapter().config_sizes(config)
    if len(budget.blocks) != sizes.blocks:
        return info
    heads = sizes.heads or info.num_heads
    note = ""
    if source is not None and source.ggml and storage != "compute":
        from .gguf.model_file import describe_storage

        note = describe_storage(source)
    return dataclasses.replace(
        info,
        storage_note=note,
        num_heads=heads,
        num_layers=sizes.blocks,
        hidden_size=heads * (sizes.head_dim or info.hidden_size // heads),
        weight_bytes=budget.total,
        block_bytes=budget.blocks,
        embed_bytes=budget.embed,
        final_bytes=budget.final,
    )


def _safetensors_params(file: Path) -> int:
    return sum(math.prod(v.get("shape", [])) for v in read_safetensors_header(file).values())


def _count_blocks(keys: Iterable[str], prefixes: Sequence[str]) -> int:
    total = 0
    for prefix in prefixes:
        idx = {k[len(prefix) :].split(".", 1)[0] for k in keys if k.startswith(prefix)}
        total += len({i for i in idx if i.isdigit()})
    return total


def _single_file_header(path: Path) -> dict[str, dict]:
    """Tensor name -> {"shape": ...} of a .safetensors or .gguf file (no data read)."""
    if path.suffix.lower() == ".gguf":
        from .gguf.model_file import allowed_families
        from .gguf.reader import GGUFFile

        file = GGUFFile(path)
        allowed_families(file)
        return {k: {"shape": list(t.shape)} for k, t in file.tensors.items()}
    return read_safetensors_header(path)


def _from_single_file(path: Path, family_id: str | None, run_bytes: int) -> ModelInfo:
    header = _single_file_header(path)
    keys = [k.removeprefix("model.diffusion_model.") for k in header]
    found = detect_family(keys)
    if found is None:
        raise ConfigError(
            f"{path.name} does not look like a {labels()} transformer",
            "its tensor names match none of the supported families (is it a full checkpoint, a LoRA or a VAE?)",
            "use a transformer-only file (models/diffusion_models) of a supported family, or a diffusers folder",
        )
    confirm_family(path.name, found, family_id)
    layers = _count_blocks(keys, _BLOCK_PREFIXES)
    spec = family(found)
    hidden = _hidden_size(header, spec.head_dim)
    params = sum(math.prod(v.get("shape", [])) for v in header.values())
    heads = max(hidden // spec.head_dim, 1)
    out = header.get("head.head.weight", header.get("model.diffusion_model.head.head.weight", {}))
    channels = int(out["shape"][0]) // 4 if "shape" in out else None  # an original-layout video head: 4 = 1x2x2
    return family_model_info(found, heads, layers, hidden, params * run_bytes, channels)


def _hidden_size(header: Mapping[str, dict], head_dim: int) -> int:
    for key, value in header.items():
        if key.removeprefix("model.diffusion_model.") in _WIDTH_KEYS:
            return int(value["shape"][0])
    return head_dim * 24
