"""What a step cache or a block cache is asked to do: the settings a cache node hands to the sampler.

``StepCacheSpec`` is ComfyUI's EasyCache / LazyCache (same inputs, defaults and ranges as ComfyUI 0.3.64's
nodes); ``BlockCacheSpec`` is the first-block / dual-block residual cache. Both are plain frozen data that
travel with a sampling job; the rules that act on them live beside this module.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from ...errors import ConfigError

STEP_CACHE_KINDS = ("easycache", "lazycache")
STEP_CACHE_NAMES = {"easycache": "EasyCache", "lazycache": "LazyCache"}
SUBSAMPLE = 8  # ComfyUI measures the change rates on every 8th latent pixel along each side
MAX_REUSE_THRESHOLD = 3.0  # the node's largest reuse_threshold (ComfyUI's input range)


def _number(name: str, value: object, low: float, high: float, node: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{node} {name}={value!r}", f"{name} is a number", f"set {name} within {low}..{high}")
    if not low <= value <= high:
        raise ConfigError(
            f"{node} {name}={value!r}", f"{name} ranges over {low}..{high}", f"set {name} within {low}..{high}"
        )


def _whole(name: str, value: object, low: int, node: str, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{node} {name}={value!r}", meaning, f"set {name} to a whole number >= {low}")


@dataclasses.dataclass(frozen=True)
class StepCacheSpec:
    """ComfyUI's EasyCache (``kind="easycache"``: measured around each model call, per conditioning) or
    LazyCache (``"lazycache"``: around the guided prediction). A step is reused while the accumulated
    estimate of the output's relative change stays under ``reuse_threshold``; the cache works between
    ``start_percent`` and ``end_percent`` of the sampling (the model sampling's percent -> sigma)."""

    kind: Literal["easycache", "lazycache"] = "easycache"
    reuse_threshold: float = 0.2
    start_percent: float = 0.15
    end_percent: float = 0.95
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.kind not in STEP_CACHE_KINDS:
            raise ConfigError(
                f"step cache kind {self.kind!r}",
                "the step caches are ComfyUI's EasyCache and LazyCache",
                f"use one of {', '.join(STEP_CACHE_KINDS)}",
            )
        node = STEP_CACHE_NAMES[self.kind]
        _number("reuse_threshold", self.reuse_threshold, 0.0, MAX_REUSE_THRESHOLD, node)
        _number("start_percent", self.start_percent, 0.0, 1.0, node)
        _number("end_percent", self.end_percent, 0.0, 1.0, node)

    @property
    def name(self) -> str:
        return STEP_CACHE_NAMES[self.kind]

    def describe(self) -> str:
        return (
            f"{self.name}: reuse threshold {self.reuse_threshold:g}, "
            f"from {self.start_percent:.0%} to {self.end_percent:.0%} of the sampling"
        )


@dataclasses.dataclass(frozen=True)
class BlockCacheSpec:
    """First-block / dual-block residual cache (FBCache, cache-dit's DBCache).

    Every model call computes the first ``first_blocks`` blocks and compares their output residual with the
    one of the last fully computed call (relative L1 over the whole sequence and every conditioning
    branch). Under ``threshold`` the middle blocks are skipped and their cached residual added instead;
    the last ``last_blocks`` blocks always run. Never more than ``max_consecutive`` reuses in a row, and the
    first ``warmup_steps`` model calls always compute."""

    threshold: float = 0.12
    first_blocks: int = 1
    last_blocks: int = 0
    max_consecutive: int = 3
    warmup_steps: int = 2
    verbose: bool = False

    def __post_init__(self) -> None:
        node = "Parallel Block Cache"
        _number("threshold", self.threshold, 0.0, 10.0, node)
        _whole("first_blocks", self.first_blocks, 1, node, "the first blocks always run (at least one, to compare)")
        _whole("last_blocks", self.last_blocks, 0, node, "the last blocks always run (0: none)")
        _whole("max_consecutive", self.max_consecutive, 1, node, "at most this many reuses in a row")
        _whole("warmup_steps", self.warmup_steps, 0, node, "the first model calls always compute")

    def check_blocks(self, num_blocks: int) -> None:
        """Raise unless the first and last blocks leave at least one block to cache."""
        if self.first_blocks + self.last_blocks >= num_blocks:
            raise ConfigError(
                f"Parallel Block Cache computes the first {self.first_blocks} and last {self.last_blocks} blocks "
                f"of a model with {num_blocks}",
                "the cache reuses the residual of the blocks in between; there are none left",
                f"use first_blocks + last_blocks < {num_blocks} (e.g. first_blocks 1, last_blocks 0)",
            )

    def describe(self) -> str:
        last = f", last {self.last_blocks} always" if self.last_blocks else ""
        return (
            f"block cache: threshold {self.threshold:g}, first {self.first_blocks} block(s){last}, "
            f"at most {self.max_consecutive} reuses in a row, {self.warmup_steps} warmup call(s)"
        )


@dataclasses.dataclass(frozen=True)
class Caches:
    """The caches a model view samples through: a step cache (Parallel EasyCache / LazyCache) and a block cache."""

    step: StepCacheSpec | None = None
    block: BlockCacheSpec | None = None

    def plus(self, spec: StepCacheSpec | BlockCacheSpec) -> Caches:
        """These caches with ``spec`` in its place (a later EasyCache / LazyCache node replaces an earlier one,
        as in ComfyUI; a later block cache the earlier block cache)."""
        if isinstance(spec, StepCacheSpec):
            return dataclasses.replace(self, step=spec)
        if isinstance(spec, BlockCacheSpec):
            return dataclasses.replace(self, block=spec)
        raise ConfigError(
            f"with_cache got {type(spec).__name__}",
            "a cache is described by a StepCacheSpec (EasyCache / LazyCache) or a BlockCacheSpec",
            "build one with parallel_runtime.denoise.caching.StepCacheSpec(...) or BlockCacheSpec(...)",
        )
