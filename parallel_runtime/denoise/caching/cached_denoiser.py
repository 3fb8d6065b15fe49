"""A Denoiser whose evaluations go through a step cache (EasyCache / LazyCache) and / or a block cache.

Model calls are formed as ComfyUI forms them (``comfy/samplers.py`` ``_calc_cond_batch``): the active entries
of both branches in order (positive first), each call the entries that batch with the first remaining one,
ComfyUI's batch order being the reverse of that list. Every rank forms the same calls; under CFG parallel
each rank computes its branch's part of each call, and a call with no entry on a rank still takes part in
the call's cache decisions there. Without caches the plain :class:`~..denoiser.Denoiser` runs (this class
is only built when a cache is asked for).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator

import torch

from ...errors import ConfigError
from ...parallel.collectives import all_gather_cat
from ...sampling import Guided, cfg_combine
from ..denoiser import Denoiser
from ..entries import COUNT_FLOOR, CondEntry, can_batch, concat_conditioning
from .block_cache import BlockCache
from .decisions import DecisionGroup
from .specs import BlockCacheSpec, StepCacheSpec
from .step_caches import EasyCache, LazyCache


class CachedDenoiser(Denoiser):
    """``denoiser(x, sigma) -> denoised`` with the asked caches (same arguments as Denoiser, plus the specs)."""

    def __init__(
        self,
        *args,
        step_cache: StepCacheSpec | None = None,
        block_cache: BlockCacheSpec | None = None,
        decision_group: DecisionGroup | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if any(e.region is not None for b in self._given if b is not None for e in b):
            raise ConfigError(
                "a step or block cache with area or mask conditioning",
                "the caches decide per model call over the whole latent; an area entry's call sees a window of it",
                "remove the cache node, or the ConditioningSetArea / ConditioningSetMask nodes",
            )
        self.group = decision_group or DecisionGroup(self.mesh)
        self.easycache = self.lazycache = None
        if step_cache is not None:
            kind = EasyCache if step_cache.kind == "easycache" else LazyCache
            cache = kind(step_cache, self.ms, self.group)
            if step_cache.kind == "easycache":
                self.easycache = cache
            else:
                self.lazycache = cache
        self.blocks = None
        if block_cache is not None:
            block_cache.check_blocks(self.adapter.num_blocks)
            self.blocks = BlockCache(block_cache, self.group)

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | Guided:
        x = x.float()
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(())
        if self.lazycache is not None:
            return self.lazycache(x, sigma, self._guided)
        return self._guided(x, sigma)

    def summary(self) -> list[dict]:
        """What each cache did in this generation (skipped / reused calls and their trace)."""
        caches = (self.easycache, self.lazycache, self.blocks)
        return [c.summary() for c in caches if c is not None]

    # -- one guided evaluation -----------------------------------------------------------------------------------
    def _guided(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | Guided:
        if self.easycache is not None:
            self.easycache.begin_evaluation()
        mine = [self.mesh.rank("cfg")] if self.cfg_parallel else list(range(len(self.branches)))
        sums = {b: torch.zeros_like(x) for b in mine}
        counts = {b: torch.full_like(x, COUNT_FLOOR) for b in mine}
        for call in self._calls(sigma):
            local = [(key, entry) for key, entry in call if key[0] in mine]
            for (key, entry), pred in zip(local, self._call(x, sigma, call, local)):
                sums[key[0]] += pred * entry.strength
                counts[key[0]] += entry.strength
        preds = {b: sums[b] / counts[b] for b in mine}
        if not self.use_uncond:
            return Guided(preds[0], torch.zeros_like(preds[0])) if self.with_uncond else preds[0]
        if self.cfg_parallel:
            mesh = self.mesh
            both = all_gather_cat(preds[mine[0]].contiguous(), mesh.group("cfg"), mesh.stats, dim=0, op="cfg")
            cond_pred, uncond_pred = both.chunk(2, dim=0)
        else:
            cond_pred, uncond_pred = preds[0], preds[1]
        guided = cfg_combine(cond_pred, uncond_pred, self.cfg)
        return Guided(guided, uncond_pred) if self.with_uncond else guided

    def _calls(self, sigma: torch.Tensor) -> list[list[tuple[tuple[int, int], CondEntry]]]:
        """The model calls of this evaluation, each in ComfyUI's batch order, as ((branch, index), entry)."""
        active = [
            ((b, i), e)
            for b, branch in enumerate(self.branches)
            for i, e in enumerate(branch)
            if sigma in self.windows[id(e)]
        ]
        calls = []
        while active:
            first = active[0][1].cond
            call = [item for item in active if can_batch(item[1].cond, first)]
            active = [item for item in active if not any(item is c for c in call)]
            calls.append(call[::-1])
        return calls

    def _call(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        call: list[tuple[tuple[int, int], CondEntry]],
        local: list[tuple[tuple[int, int], CondEntry]],
    ) -> list[torch.Tensor]:
        """Denoised predictions of this rank's entries ``local`` of one model call."""
        stream: Hashable = tuple(key for key, _ in call)
        x_in = self.model_input(x, sigma).to(self.adapter.dtype)

        def run() -> list[torch.Tensor]:
            if not local:
                if self.blocks is not None:
                    self.blocks.abstain(stream)
                return []
            cond = concat_conditioning(*(e.cond for _, e in local))
            guidance = None
            if self.adapter.plan.guidance_embed:
                guidance = torch.tensor([self._guidance(e) for _, e in local for _ in range(x.shape[0])])
            blocks = None if self.blocks is None else self.blocks.runner(stream)
            shape = (x.shape[0] * len(local), *x.shape[1:])
            with self._cancel_points(call):
                out = self.model_output(torch.cat([x_in] * len(local)), shape, sigma, cond, guidance, blocks)
            return list(out.chunk(len(local)))

        if self.easycache is None:
            return [self.denoised(out, x, sigma) for out in run()]
        keys = [key for key, _ in call]
        outputs = self.easycache.call(sigma, keys, [key for key, _ in local], x_in, run)
        # ComfyUI's in-place reuse on a float32 flow model's own input (see step_caches' module doc)
        aliased = self.easycache.reused and self.ms.is_flow and x_in.dtype == torch.float32
        aliased = aliased and self._input_is_latent(x_in, local)
        return [self.denoised(out, out if aliased else x, sigma) for out in outputs]

    def _input_is_latent(self, x_in: torch.Tensor, local: list[tuple[tuple[int, int], CondEntry]]) -> bool:
        """Whether the network takes ``x_in`` itself, no channels joined from the conditioning (an adapter's
        ``condition_channels``: image-to-video start images, zeros without one): only then does ComfyUI's
        in-place reuse reach the latent."""
        join = getattr(self.adapter, "condition_channels", None)
        return join is None or all(join(x_in, e.cond) is x_in for _, e in local)

    @contextlib.contextmanager
    def _cancel_points(self, call: list[tuple[tuple[int, int], CondEntry]]) -> Iterator[None]:
        """The adapter's block-boundary cancel points (``block_hook``, collective over every rank) only in a
        call that every rank runs: under CFG parallel a call holding one branch's entries runs on half the
        ranks (the others abstain), so there the ranks agree on cancel at the step's end only."""
        hook = self.adapter.block_hook
        if hook is None or not self.cfg_parallel or {key[0] for key, _ in call} == {0, 1}:
            yield
            return
        self.adapter.block_hook = None
        try:
            yield
        finally:
            self.adapter.block_hook = hook
