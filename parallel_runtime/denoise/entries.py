"""Conditioning entries: what one branch (positive or negative) of KSampler is made of.

A ComfyUI CONDITIONING is a list of entries; ConditioningCombine concatenates lists. KSampler runs
every entry of a branch and averages their predictions weighted by their strength
(ConditioningSetAreaStrength) and, per pixel, by their area or mask (regions.py), skipping an entry outside its ConditioningSetTimestepRange; a branch
with no active entry predicts 0 (comfy/samplers.py ``_calc_cond_batch``). Each entry carries its own
Flux guidance (FluxGuidance, 3.5 when absent: ``model_base.Flux.extra_conds``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from ..errors import ConfigError
from ..models.base import Conditioning
from ..sampling import ModelSampling
from .control import ControlChain
from .regions import Region

COUNT_FLOOR = 1e-37  # ComfyUI starts each branch's weight sum here, so an empty branch divides 0 by it


@dataclasses.dataclass(frozen=True)
class CondEntry:
    """One CONDITIONING entry: text conditioning plus the options KSampler honours."""

    cond: Conditioning
    guidance: float | None = None  # Flux distilled guidance (None: the sampler's default, 3.5)
    strength: float = 1.0  # the entry's weight in its branch
    start_percent: float | None = None  # active from this fraction of the sampling (0 = start) ...
    end_percent: float | None = None  # ... until this one (1 = end)
    control: ControlChain | None = None  # ControlNets applied to this entry (ControlNetApplyAdvanced)
    region: Region | None = None  # area / mask conditioning (regions.py); None: the whole latent

    def __post_init__(self) -> None:
        for name in ("strength", "start_percent", "end_percent"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
                raise ConfigError(
                    f"conditioning {name} is {value!r}",
                    "a conditioning entry's strength and timestep range are numbers",
                    f"set {name} to a finite number (ConditioningSetAreaStrength / ConditioningSetTimestepRange)",
                )

    @property
    def is_plain(self) -> bool:
        """Weight 1 over the whole latent and active at every step (what one text encode gives)."""
        return self.strength == 1.0 and self.start_percent is None and self.end_percent is None and self.region is None


Branch = tuple[CondEntry, ...]


def as_branch(value: Conditioning | CondEntry | Sequence[CondEntry] | None) -> Branch | None:
    """A branch from one Conditioning, one entry or a sequence of entries (None stays None)."""
    if value is None:
        return None
    if isinstance(value, Conditioning):
        return (CondEntry(value),)
    if isinstance(value, CondEntry):
        return (value,)
    entries = tuple(value)
    if not entries or not all(isinstance(e, CondEntry) for e in entries):
        raise ConfigError(
            f"a conditioning branch of {type(value).__name__} {value!r:.80}",
            "a branch is a Conditioning or a non-empty sequence of CondEntry",
            "pass the Conditioning from encode_text, or CondEntry(...) items",
        )
    return entries


def expand_branch(branch: Branch | None, batch: int) -> Branch | None:
    """Every entry's conditioning repeated over the latent batch (ComfyUI does the same)."""
    if branch is None:
        return None
    return tuple(dataclasses.replace(e, cond=expand_conditioning(e.cond, batch)) for e in branch)


def expand_conditioning(cond: Conditioning, batch: int) -> Conditioning:
    """Repeat a single conditioning over the latent batch (every field alike)."""
    tensors = cond.tensors()
    if all(t is None or t.shape[0] == batch for t in tensors.values()):
        return cond
    if any(t is not None and t.shape[0] not in (1, batch) for t in tensors.values()):
        sizes = {name: t.shape[0] for name, t in tensors.items() if t is not None}
        raise ConfigError(
            f"conditioning has batch sizes {sizes} but the latent has batch {batch}",
            "each latent in the batch needs one conditioning (or one shared by all)",
            "encode one prompt, or as many prompts as latents",
        )

    def rep(t):
        return t if t is None or t.shape[0] == batch else t.expand(batch, *t.shape[1:]).contiguous()

    return cond.with_tensors({name: rep(t) for name, t in tensors.items()})


def can_batch(a: Conditioning, b: Conditioning) -> bool:
    """Whether two conditionings can run as one batch: the same optional parts, of the same shapes."""
    if type(a.extras) is not type(b.extras):  # a family's extras hold at least one tensor when present
        return False
    if a.extras is not None and any(getattr(a.extras, n) != getattr(b.extras, n) for n in a.extras.settings_fields):
        return False
    for x, y in zip(a.tensors().values(), b.tensors().values()):
        if (x is None) != (y is None) or (x is not None and x.shape[1:] != y.shape[1:]):
            return False
    return True


def concat_conditioning(*conds: Conditioning) -> Conditioning:
    """The conditionings as one batch, in order (every field alike)."""

    def cat(parts):
        return None if parts[0] is None else torch.cat([p.to(parts[0].dtype) for p in parts])

    names = conds[0].tensors().keys()
    return conds[0].with_tensors({name: cat([c.tensors()[name] for c in conds]) for name in names})


class ActiveWindow:
    """When an entry is active: ComfyUI turns start/end percent into sigmas with the model sampling
    in force and skips the entry while sigma > start or sigma < end (compared in float32)."""

    def __init__(self, entry: CondEntry, model_sampling: ModelSampling):
        def sigma(percent: float | None) -> torch.Tensor | None:
            return (
                None if percent is None else torch.tensor(model_sampling.percent_to_sigma(percent), dtype=torch.float32)
            )

        self.start, self.end = sigma(entry.start_percent), sigma(entry.end_percent)

    def __contains__(self, sigma: torch.Tensor) -> bool:
        sigma = sigma.float().cpu()
        if self.start is not None and bool(sigma > self.start):
            return False
        return not (self.end is not None and bool(sigma < self.end))
