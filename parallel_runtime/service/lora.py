"""LoRA on a loaded parallel model, host side: which files at which strengths, checked before any job.

A :class:`LoraSpec` names a file and its two strengths (transformer, text encoders). A model view with
LoRAs (``ParallelModel.with_loras``) shares the warm pool of its base model; every job it submits carries
the stack (file identities taken at submit time, so an edited file is read again), and the workers bring
their weights to exactly that stack before running (``lora_state``). Nothing is reloaded from disk.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from ..models.lora.files import lora_file_id, read_lora
from ..models.lora.keymap import ModelKeys
from ..models.lora.patcher import StackEntry
from ..models.lora.resolve import Resolution, check_resolution, resolve


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """One LoRA of a stack: a .safetensors file, its strength on the transformer and on the text encoders."""

    path: str
    strength_model: float = 1.0
    strength_clip: float = 1.0

    @classmethod
    def of(cls, path: str | os.PathLike, strength_model: float = 1.0, strength_clip: float = 1.0) -> LoraSpec:
        return cls(str(Path(path).expanduser().resolve()), float(strength_model), float(strength_clip))

    @property
    def name(self) -> str:
        return Path(self.path).name

    def describe(self) -> str:
        clip = f", clip {self.strength_clip:g}" if self.strength_clip != self.strength_model else ""
        return f"{self.name} @ {self.strength_model:g}{clip}"


def stack_entries(specs: Sequence[LoraSpec]) -> tuple[StackEntry, ...]:
    """The stack a job carries: the files as they are on disk now (entries with both strengths 0 dropped,
    as ComfyUI's loader returns the model untouched for them)."""
    return tuple(
        StackEntry(lora_file_id(s.path), s.strength_model, s.strength_clip)
        for s in specs
        if s.strength_model != 0.0 or s.strength_clip != 0.0
    )


def inspect_lora(spec: LoraSpec, keys: ModelKeys) -> Resolution:
    """What ``spec`` does to the model of ``keys`` (header only); raises ConfigError for a file that
    changes nothing of it (another family, another size, unsupported kinds) and logs partial matches."""
    resolution = resolve(read_lora(lora_file_id(spec.path), meta=True), keys)
    check_resolution(resolution, keys, spec.name, text_on_workers=bool(keys.encoders))
    return resolution
