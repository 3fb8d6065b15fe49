"""Load a diffusers pipeline folder (model_index.json) from local files only, part by part.

Components are created with their own diffusers/transformers classes (named in model_index.json,
looked up only in those two libraries) and placed on a device in a dtype. The model family is
detected from the transformer class through the adapter registry.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .families.registry import family as family_spec
from .registry import adapter_class_for, supported_class_names

PARTS: tuple[str, ...] = ("transformer", "vae", "text")
_LIBRARIES = ("diffusers", "transformers")
DeviceSpec = str | torch.device | Mapping[str, Any]  # one device, or component/part -> device (or {gpu: bytes})


@dataclasses.dataclass
class PipelineComponents:
    """What was loaded from one diffusers folder. Missing parts are None / empty."""

    path: Path
    family: str
    pipeline_class: str
    model_index: dict[str, Any]
    transformer_config: dict[str, Any]
    scheduler_config: dict[str, Any]
    transformer: nn.Module | None = None
    transformer_2: nn.Module | None = None  # Wan 2.2 A14B: the low-noise expert (below ``boundary_ratio``)
    boundary_ratio: float | None = None  # noise level (sigma) where the second expert takes over
    vae: nn.Module | None = None
    text_encoders: dict[str, nn.Module] = dataclasses.field(default_factory=dict)  # "text_encoder", "..._2"
    tokenizers: dict[str, Any] = dataclasses.field(default_factory=dict)  # "tokenizer", "tokenizer_2", ...

    def adapter(self):
        """The model adapter for the loaded transformer (latent format read from the VAE when loaded)."""
        from . import LatentFormat, get_adapter

        if self.transformer is None:
            raise ConfigError(
                f"the transformer of {self.path} was not loaded",
                "an adapter drives the transformer's modules",
                'load with parts including "transformer"',
            )
        # AutoencoderKL-style VAEs record scale and shift, Wan-style ones per-channel statistics; FLUX.2's
        # batch-norm VAE records neither (its latent format is the family's: ComfyUI's identity)
        config = getattr(self.vae, "config", None)
        known = config is not None and ("scaling_factor" in config or "latents_mean" in config)
        fmt = LatentFormat.from_vae_config(config) if known else None
        return get_adapter(self.transformer, fmt)

    def second_expert(self):
        """(adapter of the low-noise expert, boundary sigma) of a two-expert pipeline, else None."""
        if self.transformer_2 is None:
            return None
        from . import get_adapter

        return get_adapter(self.transformer_2, self.adapter().plan.latent_format), float(self.boundary_ratio)


def has_second_expert(index: Mapping[str, Any]) -> bool:
    """Whether model_index.json names a second transformer with a switching boundary (Wan 2.2 A14B)."""
    entry = index.get("transformer_2")
    if not (isinstance(entry, list) and entry[0]):
        return False
    if index.get("boundary_ratio") is None:
        raise ConfigError(
            "the pipeline has a second transformer but no boundary_ratio",
            "two experts take turns at a noise level; without it nothing says when",
            "use the pipeline's model_index.json as published (Wan 2.2 A14B sets boundary_ratio)",
        )
    return True


def read_model_index(path: str | os.PathLike) -> dict[str, Any]:
    """model_index.json of a diffusers folder, with clear errors for a missing folder or file."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"model folder {path} does not exist" if not path.exists() else f"{path} is not a folder",
            "a diffusers model is a folder with model_index.json and one sub-folder per component",
            "pass the path of a diffusers folder (e.g. ComfyUI/models/diffusers/FLUX.1-dev)",
        )
    index = path / "model_index.json"
    if not index.is_file():
        found = ", ".join(sorted(p.name for p in path.iterdir())[:12]) or "nothing"
        raise ConfigError(
            f"{path} has no model_index.json (found: {found})",
            "model_index.json names the pipeline's components and their classes",
            "point at the top folder of a diffusers pipeline (the one holding model_index.json); "
            "single .safetensors checkpoints are not diffusers folders",
        )
    with open(index, encoding="utf-8") as f:
        return json.load(f)


def component_class(name: str, entry: Any, path: Path) -> type:
    """The diffusers/transformers class ``entry`` of model_index.json names (no remote code). A component defined
    in a diffusers pipeline's own module (saved as ``[<pipeline module>, <class>]``, e.g. a pipeline's text
    connectors) is read from ``diffusers.pipelines.<module>``."""
    if isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] not in _LIBRARIES:
        pipeline_class = _pipeline_module_class(entry)
        if pipeline_class is not None:
            return pipeline_class
    if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] in _LIBRARIES):
        raise ConfigError(
            f"component {name!r} in {path / 'model_index.json'} is {entry!r}",
            f"only components from {' or '.join(_LIBRARIES)} are loaded (no remote code)",
            "use a standard diffusers pipeline folder",
        )
    import importlib

    library = importlib.import_module(entry[0])
    cls = getattr(library, entry[1], None)
    if cls is None:
        raise ConfigError(
            f"{entry[0]} has no class {entry[1]!r} (component {name!r} of {path})",
            "the folder was saved by a newer or different library version",
            f"update {entry[0]} or re-save the folder with the installed version",
        )
    return cls


def _pipeline_module_class(entry: Any) -> type | None:
    """The class ``entry[1]`` of the diffusers pipeline module ``entry[0]`` (None when there is none)."""
    import importlib

    module_name = entry[0]
    if not (isinstance(module_name, str) and module_name.isidentifier() and isinstance(entry[1], str)):
        return None
    try:
        module = importlib.import_module(f"diffusers.pipelines.{module_name}")
    except ImportError:
        return None
    cls = getattr(module, entry[1], None)
    return cls if isinstance(cls, type) else None


def _read_json(file: Path) -> dict[str, Any]:
    with open(file, encoding="utf-8") as f:
        return json.load(f)


def _ordinal(device: str | torch.device) -> int:
    d = torch.device(device)
    if d.type != "cuda":
        raise ConfigError(
            f"a text encoder split over {device}",
            "only GPUs get a share of a split text encoder (CPU ranks share one memory: nothing to split)",
            "split over cuda devices only",
        )
    return d.index or 0


def text_encoder_options(family: str, folder: Path) -> dict[str, Any]:
    """from_pretrained options the family states for its text encoder in ``folder`` (e.g. FLUX.2 builds
    Mistral with only the layers it reads); none for most."""
    options = family_spec(family).text_encoding().loader_options
    return options(folder) if options is not None else {}


def _check_parts(parts: Iterable[str]) -> tuple[str, ...]:
    parts = tuple(parts)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ConfigError(
            f"unknown part(s) {unknown}",
            "parts select which components of the pipeline are loaded",
            f"use any of: {', '.join(PARTS)}",
        )
    return parts


def load_pipeline_components(
    path: str | os.PathLike,
    device: DeviceSpec = "cpu",
    dtype: torch.dtype = torch.float32,
    parts: Iterable[str] = PARTS,
    before_each: Callable[[str], None] | None = None,
) -> PipelineComponents:
    """Load the selected ``parts`` of the diffusers folder ``path`` (local files only).

    ``device`` is one device, or a mapping from component name ("transformer", "vae",
    "text_encoder_2", ...) or part name ("text") to device; unnamed components go to the CPU. A text
    encoder mapped to ``{gpu: bytes, ...}`` is spread over those GPUs by layers, at most that many bytes
    on each (accelerate's device map).
    Tokenizers and the scheduler config are always read (small). ``before_each(name)`` is called
    before each weighted component (a progress point; it may raise to stop the load)."""
    parts = _check_parts(parts)
    path = Path(path).expanduser()
    index = read_model_index(path)
    if "transformer" not in index or not (path / "transformer").is_dir():
        raise ConfigError(
            f"{path} has no transformer component",
            "this engine runs diffusion transformers (DiT) only; UNet pipelines are not supported",
            f"use a pipeline whose transformer is one of: {', '.join(supported_class_names())}",
        )
    transformer_cls = component_class("transformer", index["transformer"], path)
    family = adapter_class_for(transformer_cls).family  # raises for unsupported classes
    comps = PipelineComponents(
        path=path,
        family=family,
        pipeline_class=str(index.get("_class_name", "")),
        model_index=index,
        transformer_config=_read_json(path / "transformer" / "config.json"),
        scheduler_config=_read_json(path / "scheduler" / "scheduler_config.json")
        if (path / "scheduler" / "scheduler_config.json").is_file()
        else {},
    )

    def load_model(name: str, part: str) -> nn.Module:
        if before_each is not None:
            before_each(name)
        cls = component_class(name, index[name], path)
        kw: dict[str, Any] = {"torch_dtype": dtype} if index[name][0] == "diffusers" else {"dtype": dtype}
        if part == "text":
            kw.update(text_encoder_options(family, path / name))
        where = device.get(name, device.get(part, "cpu")) if isinstance(device, Mapping) else device
        if isinstance(where, Mapping):  # an encoder larger than any one device: its layers spread over several
            kw.update(device_map="auto", max_memory={**{_ordinal(d): int(b) for d, b in where.items()}, "cpu": 0})
            return cls.from_pretrained(path / name, local_files_only=True, **kw).eval().requires_grad_(False)
        model = cls.from_pretrained(path / name, local_files_only=True, **kw)
        return model.to(torch.device(where)).eval().requires_grad_(False)

    if "transformer" in parts:
        comps.transformer = load_model("transformer", "transformer")
        if has_second_expert(index):  # both experts of a two-expert pipeline (Wan 2.2 A14B)
            comps.transformer_2 = load_model("transformer_2", "transformer")
            comps.boundary_ratio = float(index["boundary_ratio"])
    if "vae" in parts and isinstance(index.get("vae"), list) and index["vae"][0]:
        comps.vae = load_model("vae", "vae")
    for name, entry in sorted(index.items()):
        if name.startswith("tokenizer") and isinstance(entry, list) and entry[0]:
            cls = component_class(name, entry, path)
            comps.tokenizers[name] = cls.from_pretrained(path / name, local_files_only=True)
        text_part = name.startswith("text_encoder") or name in family_spec(family).text.components
        if "text" in parts and text_part and isinstance(entry, list) and entry[0]:
            comps.text_encoders[name] = load_model(name, "text")
    return comps
