"""Reading LoRA files: identity (so an edited file is read again), header-only or full reads, format fixes.

Only ``.safetensors`` files are read (no pickles: nothing in a LoRA file may run code). A header-only
read gives "meta" tensors with the real shapes (and the real ``alpha`` scalars), which is all key
resolution needs; the workers read the data. XLabs files (``*.processor.qkv_lora1...``) are renamed to
diffusers/PEFT names with diffusers' own converter before anything else looks at them.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from ...errors import ConfigError

LORA_SUFFIXES: tuple[str, ...] = (".safetensors", ".sft")
Tensors = dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class LoraFileId:
    """A LoRA file as it is on disk now (path, size, modification time)."""

    path: str
    size: int
    mtime_ns: int

    @property
    def name(self) -> str:
        return Path(self.path).name


def lora_file_id(path: str | os.PathLike) -> LoraFileId:
    """The identity of the LoRA file ``path``, with a clear error for a missing or wrong file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(
            f"LoRA file {p} does not exist" if not p.exists() else f"{p} is not a file",
            "a LoRA is one .safetensors file (ComfyUI keeps them in models/loras)",
            "pick an existing file from models/loras and refresh the page (R) if it is new",
        )
    if not p.name.endswith(LORA_SUFFIXES):
        raise ConfigError(
            f"{p.name} is not a .safetensors file",
            "LoRA files are read as safetensors only (pickled .pt/.ckpt files could run code while loading)",
            "use the .safetensors release of the LoRA, or convert the file to .safetensors",
        )
    stat = p.stat()
    return LoraFileId(str(p.resolve()), stat.st_size, stat.st_mtime_ns)


def read_lora(file: LoraFileId, meta: bool = False) -> Tensors:
    """The tensors of ``file`` (CPU), or with ``meta`` only their shapes (scalar ``alpha`` values are
    read either way). Raises ConfigError for a file that is not a readable safetensors file."""
    from safetensors import SafetensorError, safe_open

    try:
        out: Tensors = {}
        with safe_open(file.path, framework="pt", device="cpu") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                if meta and not key.endswith(".alpha"):
                    piece = f.get_slice(key)
                    out[key] = torch.empty(piece.get_shape(), dtype=_dtype(piece.get_dtype()), device="meta")
                else:
                    out[key] = f.get_tensor(key)
    except (SafetensorError, OSError) as exc:
        raise ConfigError(
            f"{file.name} could not be read as a safetensors file ({exc})",
            "a LoRA file is a safetensors file of tensors",
            "download the file again (it may be incomplete) or pick another LoRA",
        ) from None
    if os.stat(file.path).st_mtime_ns != file.mtime_ns:
        raise ConfigError(
            f"{file.name} changed while it was read",
            "a LoRA file must stay the same while it is in use",
            "wait until the file is written completely, then run the prompt again",
        )
    return normalize(out, file.name)


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _dtype(name: str) -> torch.dtype:
    return _DTYPES.get(name, torch.float32)


def alphas(tensors: Tensors) -> dict[str, float]:
    """The ``alpha`` scalars of a LoRA (key -> value)."""
    return {k: float(v.float().reshape(-1)[0]) for k, v in tensors.items() if k.endswith(".alpha") and v.numel()}


def normalize(tensors: Tensors, name: str) -> Tensors:
    """Formats that need renaming before key resolution: XLabs (diffusers' converter); BFL control
    LoRAs widen the model's input layer, which a patch cannot do."""
    if "img_in.lora_A.weight" in tensors and any("query_norm.scale" in k for k in tensors):
        raise ConfigError(
            f"{name} is a Flux control LoRA (Canny/Depth)",
            "control LoRAs widen the model's input layer for the extra image channels, which is a different model",
            "use the control model's own transformer file, or a regular LoRA",
        )
    if any(".processor." in k and ("_lora1." in k or "_lora2." in k or ".qkv_lora." in k) for k in tensors):
        from ..compat import convert_xlabs_flux_lora

        return convert_xlabs_flux_lora(dict(tensors))
    return tensors
