"""LoRA on a loaded parallel model, host side: which files at which strengths, checked before any job.

A :class:`LoraSpec` names a file and its two strengths (transformer, text encoders). A model view with
LoRAs (``ParallelModel.with_loras``) shares the warm pool of its base model; every job it submits carries
the stack (file identities taken at submit time, so an edited file is read again), and the workers bring
their weights to exactly that stack before running (``lora_state``). Nothing is reloaded from disk.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..models.lora.files import LoraFileId, lora_file_id, read_lora
from ..models.lora.keymap import ModelKeys
from ..models.lora.patcher import StackEntry
from ..models.lora.resolve import Resolution, check_resolution, resolve
from .choices import LORA_STRENGTH_LIMIT


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


STRENGTH_LIMIT = LORA_STRENGTH_LIMIT  # ComfyUI's LoraLoader takes strengths in [-100, 100]


def check_strengths(spec: LoraSpec) -> None:
    """Both strengths finite and within ComfyUI's LoraLoader range."""
    for name in ("strength_model", "strength_clip"):
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(
                f"{spec.name}: {name}={value!r}",
                "a strength scales the LoRA's change of each weight; a NaN or infinite one makes every weight it "
                "touches NaN or infinite (a black or noise image)",
                f"use a finite number between {-STRENGTH_LIMIT:g} and {STRENGTH_LIMIT:g} (1.0: as trained)",
            )
        if abs(value) > STRENGTH_LIMIT:
            raise ConfigError(
                f"{spec.name}: {name}={value:g} is out of range",
                f"ComfyUI's LoRA loaders take strengths from {-STRENGTH_LIMIT:g} to {STRENGTH_LIMIT:g}; far beyond "
                "that the patched weights are finite but meaningless (the picture turns to noise)",
                f"use a strength between {-STRENGTH_LIMIT:g} and {STRENGTH_LIMIT:g} (1.0: as trained)",
            )


class LoraChecks:
    """The checks of the LoRAs applied to one loaded model (the node's and the API's alike): strengths,
    and what the file patches of this model (:func:`inspect_lora`), read once per version of the file
    (an edited file is checked again)."""

    def __init__(self) -> None:
        self._seen: dict[LoraFileId, Resolution] = {}
        self._lock = threading.Lock()

    def check(self, spec: LoraSpec, keys: ModelKeys) -> Resolution | None:
        """Raise ConfigError for a spec this model must not take; its resolution (None when both
        strengths are 0: ComfyUI leaves the model untouched then)."""
        if not isinstance(spec, LoraSpec):
            raise ConfigError(
                f"with_loras got {type(spec).__name__}",
                "a LoRA of a stack is described by a LoraSpec (file and strengths)",
                "build one with LoraSpec.of(path, strength_model, strength_clip)",
            )
        check_strengths(spec)
        if spec.strength_model == 0.0 and spec.strength_clip == 0.0:
            return None
        file_id = lora_file_id(spec.path)
        with self._lock:
            if file_id not in self._seen:
                self._seen[file_id] = inspect_lora(spec, keys)
            return self._seen[file_id]
