"""Parallel EasyCache / Parallel LazyCache / Parallel Block Cache: step and block caches for a PARALLEL_MODEL.

Parallel EasyCache and Parallel LazyCache take ComfyUI's EasyCache / LazyCache inputs (same names, defaults
and ranges) and skip the same steps, so a graph gives the picture ComfyUI's cache node + KSampler gives on
the same file. Parallel Block Cache reuses the middle blocks' residual while the first blocks' residual
barely changes (FBCache / DBCache). Each returns a new PARALLEL_MODEL on the same warm pool (nothing is
reloaded); every rank of the pool takes the same decisions.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from .declare import DeclaredNode, Float, Input, Int, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle

if TYPE_CHECKING:
    from parallel_runtime.service.api import ParallelModel

MAX_BLOCKS = 1000
MAX_REUSE_THRESHOLD = 3.0  # ComfyUI's EasyCache / LazyCache reuse_threshold range
MAX_BLOCK_THRESHOLD = 10.0


@dataclasses.dataclass(frozen=True)
class CacheModifier:
    """Samples the model through ``spec`` (a StepCacheSpec or BlockCacheSpec; the cache nodes' handle modifier)."""

    spec: Any

    def apply(self, model: ParallelModel) -> ParallelModel:
        return model.with_cache(self.spec)

    def describe(self) -> str:
        return self.spec.describe()


def _cached(handle: ParallelModelHandle, spec: Any) -> dict[str, Any]:
    return {"ui": {"text": [spec.describe()]}, "result": (handle.derive(CacheModifier(spec)),)}


def _fraction(name: str, tooltip: str, default: float, high: float = 1.0) -> Input:
    return Float(name, tooltip, default, 0.0, high, step=0.01)


def _verbose() -> Input:
    return Input("verbose", "BOOLEAN", "Log every decision in the workers' log.", default=False)


def _step_cache_inputs(name: str) -> tuple[Input, ...]:
    return (
        Socket("parallel_model", PARALLEL_MODEL, f"The parallel model to add {name} to."),
        _fraction("reuse_threshold", "The threshold for reusing cached steps.", 0.2, MAX_REUSE_THRESHOLD),
        _fraction("start_percent", f"The relative sampling step to begin use of {name}.", 0.15),
        _fraction("end_percent", f"The relative sampling step to end use of {name}.", 0.95),
        _verbose(),
    )


class ParallelEasyCache(DeclaredNode):
    """ComfyUI's EasyCache for a PARALLEL_MODEL: the same inputs, the same skipped steps."""

    KIND = "easycache"
    SPEC = NodeSpec(
        node_id="DiTParallelEasyCache",
        display_name="Parallel EasyCache",
        description=(
            "Like EasyCache: skips a model call while the output is estimated to change little, reusing the last "
            "call's output - input difference. Same inputs and decisions as ComfyUI's node; on every layout every "
            "worker takes the same decision (measured over the whole image and both CFG branches)."
        ),
        inputs=_step_cache_inputs("EasyCache"),
        outputs=(Output(PARALLEL_MODEL, "The same parallel model (same workers) with EasyCache."),),
        function="patch",
    )

    def patch(
        self,
        parallel_model: ParallelModelHandle,
        reuse_threshold: float,
        start_percent: float,
        end_percent: float,
        verbose: bool,
    ) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import step_cache

        return _cached(parallel_model, step_cache(self.KIND, reuse_threshold, start_percent, end_percent, verbose))


class ParallelLazyCache(ParallelEasyCache):
    """ComfyUI's LazyCache for a PARALLEL_MODEL: measured around the guided prediction."""

    KIND = "lazycache"
    SPEC = NodeSpec(
        node_id="DiTParallelLazyCache",
        display_name="Parallel LazyCache",
        description=(
            "Like LazyCache: EasyCache's rule measured around the guided (CFG) prediction instead of each model "
            "call. Same inputs and decisions as ComfyUI's node, on every layout."
        ),
        inputs=_step_cache_inputs("LazyCache"),
        outputs=(Output(PARALLEL_MODEL, "The same parallel model (same workers) with LazyCache."),),
        function="patch",
    )


def _blocks(name: str, tooltip: str, default: int, low: int) -> Input:
    return Int(name, tooltip, default, low, MAX_BLOCKS)


class ParallelBlockCache(DeclaredNode):
    """First-block / dual-block residual cache (FBCache, DBCache) for a PARALLEL_MODEL."""

    SPEC = NodeSpec(
        node_id="DiTParallelBlockCache",
        display_name="Parallel Block Cache",
        description=(
            "Computes the first blocks of every model call and, while their residual stays within threshold "
            "(relative L1) of the last fully computed call's, reuses the cached residual of the middle blocks; the "
            "last blocks always run. Works on every layout: Ulysses / Ring and CFG parallel decide over the whole "
            "image and both branches, PipeFusion decides per patch on the stage holding the first blocks."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "The parallel model to add the block cache to."),
            _fraction(
                "threshold",
                "Reuse while the first blocks' residual changed less than this (relative L1).",
                0.12,
                MAX_BLOCK_THRESHOLD,
            ),
            _blocks("first_blocks", "Blocks always computed first; their residual decides (Fn).", 1, 1),
            _blocks("last_blocks", "Blocks always computed last (Bn); 0: none.", 0, 0),
            _blocks("max_consecutive", "At most this many reuses in a row.", 3, 1),
            _blocks("warmup_steps", "The first model calls always compute.", 2, 0),
            _verbose(),
        ),
        outputs=(Output(PARALLEL_MODEL, "The same parallel model (same workers) with the block cache."),),
        function="patch",
    )

    def patch(
        self,
        parallel_model: ParallelModelHandle,
        threshold: float,
        first_blocks: int,
        last_blocks: int,
        max_consecutive: int,
        warmup_steps: int,
        verbose: bool,
    ) -> dict[str, Any]:
        from parallel_runtime.service.comfy_graph import block_cache

        spec = block_cache(threshold, first_blocks, last_blocks, max_consecutive, warmup_steps, verbose)
        return _cached(parallel_model, spec)
