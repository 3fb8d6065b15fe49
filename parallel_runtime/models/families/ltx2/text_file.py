"""LTX-2's prompts through Parallel Text Encode from the files artists have: Gemma-3 12B as ONE file in
``models/text_encoders`` (``gemma_3_12B_it*.safetensors``, read by ``text_files.load_gemma3_file``) and the text
connectors from the LTX-2 checkpoint the Parallel Model Loader loaded (``ltx-2-19b-dev.safetensors``: as later
ComfyUI's LTX-2 text-encoder loader takes the Gemma file with the checkpoint), or from a file holding them given as
``text_encoder_2``, or from the loaded diffusers folder's ``connectors``. The prompts are then encoded as from the
diffusers folder (``text.encode``, LTX2Pipeline's encode_prompt + connectors)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...compat import ltx2_text_connectors_class
from ...tensor_files import SafetensorsFile
from ..spec import ModelFilePart, TextEncoderFile
from .text import encode
from .text_files import (
    connector_prefixes,
    gemma3_tokenizer,
    gemma_prefix,
    load_gemma3_file,
    load_ltx2_connectors_file,
)

CONNECTORS_KEY = "connectors"  # the overrides' entry for the connectors' config (the rest is Gemma's)
RELEASE = "ltx-2-19b-dev.safetensors"


def _shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]] | None:
    """A safetensors file's tensor shapes (None: not a readable safetensors file)."""
    try:
        return SafetensorsFile(Path(path).expanduser()).shapes()
    except (OSError, ConfigError):
        return None


def check_gemma3_file(path: str) -> None:
    """On the host: ``path`` is a safetensors file holding Gemma-3's text model."""
    shapes = _shapes(path) if str(path).lower().endswith((".safetensors", ".sft")) else None
    if shapes is None:
        raise ConfigError(
            f"{Path(path).name} is not a safetensors file of Gemma-3",
            "LTX-2 encodes prompts with Gemma-3 12B, read from ONE safetensors file here",
            "pick gemma_3_12B_it.safetensors (or its fp8 / bf16 variant) from models/text_encoders",
        )
    gemma_prefix(shapes, path)


def load_gemma(path: str, device: Any = "cpu", dtype: torch.dtype = torch.bfloat16, overrides=None) -> nn.Module:
    """Gemma-3's text model of ``path`` (``overrides``: its config entries; the connectors' entry is left out)."""
    gemma = {k: v for k, v in (overrides or {}).items() if k != CONNECTORS_KEY}
    return load_gemma3_file(path, device, dtype, gemma)


def _connectors_folder(path: str | os.PathLike) -> Path | None:
    folder = Path(path).expanduser() / CONNECTORS_KEY
    return folder if (folder / "config.json").is_file() else None


def holds_connectors(path: str) -> bool:
    """Whether a file (its header) or a diffusers folder holds LTX-2's text connectors."""
    if Path(path).is_dir():
        return _connectors_folder(path) is not None
    shapes = _shapes(path) if str(path).lower().endswith((".safetensors", ".sft")) else None
    return shapes is not None and connector_prefixes(shapes) is not None


def connectors_bytes(path: str) -> int:
    """The bytes of the connectors' tensors in ``path`` (a file, or a diffusers folder's ``connectors``)."""
    folder = _connectors_folder(path) if Path(path).is_dir() else None
    if folder is not None:
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    file = SafetensorsFile(Path(path).expanduser())
    prefixes = connector_prefixes(file.shapes()) or ()
    return sum(e.nbytes for k, e in file.entries.items() if k.startswith(prefixes))


def load_connectors(path: str, device: Any = "cpu", dtype: torch.dtype = torch.bfloat16, overrides=None) -> nn.Module:
    """The text connectors of a checkpoint or connectors file, or of a diffusers folder's ``connectors``."""
    folder = _connectors_folder(path) if Path(path).is_dir() else None
    if folder is not None:
        connectors = ltx2_text_connectors_class().from_pretrained(str(folder), torch_dtype=dtype)
        return connectors.to(device).eval()
    return load_ltx2_connectors_file(path, device, dtype, (overrides or {}).get(CONNECTORS_KEY))


class _FileComponents:
    """Gemma, the connectors and the tokenizer in the shape ``text.encode`` reads."""

    def __init__(self, gemma: nn.Module, connectors: nn.Module, tokenizer: Any):
        self.path = Path("text encoder files")
        self.text_encoders: Mapping[str, nn.Module] = {"text_encoder": gemma, "connectors": connectors}
        self.tokenizers = {"tokenizer": tokenizer}


@torch.no_grad()
def encode_files(encoders, tokenizer, prompts: Sequence[str], max_sequence_length: int = 1024) -> Conditioning:
    """LTX-2 conditioning of ``prompts`` from (Gemma-3, connectors) ``encoders`` and Gemma's ``tokenizer``."""
    gemma, connectors = encoders
    device = next(connectors.parameters()).device
    return encode(_FileComponents(gemma, connectors, tokenizer), list(prompts), max_sequence_length, device)


CONNECTORS = ModelFilePart("LTX-2 text connectors", load_connectors, holds_connectors, connectors_bytes, RELEASE)

ENCODER_FILE = TextEncoderFile(
    "Gemma-3", load_gemma, encode_files, 1024, tokenizer=gemma3_tokenizer, check=check_gemma3_file,
    model_part=CONNECTORS,
)  # fmt: skip
