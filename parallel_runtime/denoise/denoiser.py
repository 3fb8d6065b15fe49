"""Denoiser: ``x, sigma -> denoised`` for the whole latent with classifier-free guidance over
conditioning branches of one or more entries, as ComfyUI's KSampler computes it (batched entries,
one model call per shape, or CFG-parallel over the mesh)."""

from __future__ import annotations

import torch

from ..attention.usp import SequenceParallelAttention
from ..models.base import BlockRunner, Conditioning, ModelAdapter
from ..models.reference_latents import reference_count
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..sampling import Guided, ModelSampling, cfg_combine, uses_uncond
from .control import ActiveLinks, AddResiduals, ControlChain, ControlRunner, chain_residuals, layout_tag, same_control
from .entries import COUNT_FLOOR, ActiveWindow, Branch, CondEntry, as_branch, can_batch, concat_conditioning
from .regions import Placement, pair_areas, place
from .settings import embedded_guidance


class Denoiser:
    """``denoiser(x, sigma) -> denoised`` for the whole latent, with classifier-free guidance.

    Each branch's prediction is the strength-weighted mean of its active entries' predictions
    (comfy/samplers.py ``_calc_cond_batch``); an entry with an area or mask (``regions``) runs on its window
    of the latent and weighs per pixel. Entries whose text shapes and windows agree run as one batch,
    positive and negative together (as ComfyUI does); others one model call each. With a cfg mesh
    dimension of 2, rank cfg=0 evaluates the positive branch, cfg=1 the negative, and one all-gather
    over "cfg" gives both ranks both predictions (exact).

    ``with_uncond`` (the CFG++ samplers): the negative is evaluated at every cfg, cfg 1 included, and
    the answer is ``Guided(denoised, uncond)``; without a negative the unconditional prediction is 0
    (ComfyUI's, for a guider without one).
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        mesh: ParallelMesh,
        model_sampling: ModelSampling,
        positive: Branch | Conditioning,
        negative: Branch | Conditioning | None,
        cfg: float,
        guidance: float | None = None,
        attention_backend: str = "auto",
        with_uncond: bool = False,
    ):
        self.adapter, self.mesh, self.ms = adapter, mesh, model_sampling
        self.cfg, self.with_uncond = cfg, with_uncond
        positive, negative = as_branch(positive), as_branch(negative)
        self.use_uncond = uses_uncond(cfg, negative) or (with_uncond and negative is not None)
        self.branches: list[Branch] = [positive, negative] if self.use_uncond else [positive]
        self.guidance = embedded_guidance(adapter, guidance)  # for entries without their own
        self._given = (positive, negative)  # the negative's areas get partners even where it does not run
        self.windows = {id(e): ActiveWindow(e, model_sampling) for b in self.branches for e in b}
        self._layouts: dict[tuple[int, ...], tuple[list[Branch], dict[int, Placement]]] = {}
        self.attention = SequenceParallelAttention(mesh, attention_backend)
        self.cfg_parallel = self.use_uncond and mesh.size("cfg") == 2
        self.denoise_mask: torch.Tensor | None = None  # a LATENT's noise mask (the model may read it)
        self.controls: dict[str, ControlRunner] = {}  # the loaded ControlNets by file (entries' control chains)
        self.active_links = ActiveLinks(model_sampling)
        self.evaluations = 0

    def _guidance(self, entry: CondEntry) -> float | None:
        if not self.adapter.plan.guidance_embed:
            return None
        return entry.guidance if entry.guidance is not None else self.guidance

    def _forward(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        control: ControlChain | None = None,
        entries: int = 1,
    ) -> torch.Tensor:
        """Denoised prediction of one batch of ``entries`` entries (``x`` repeated per entry) sharing ``control``."""
        out = self.model_output(
            self.model_input(x, sigma), x.shape, sigma, cond, guidance, control=control, entries=entries
        )
        return self.denoised(out, x, sigma)

    def model_input(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """What the network takes for the noisy latent ``x`` at ``sigma`` (ComfyUI's ``calculate_input``)."""
        return self.ms.calculate_input(_per_sample(sigma, x), x)

    def denoised(self, out: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """The denoised prediction from the network output ``out`` for the noisy latent ``x``."""
        return self.ms.calculate_denoised(_per_sample(sigma, x), out.float(), x)

    def model_output(
        self,
        x_in: torch.Tensor,
        shape: torch.Size | tuple[int, ...],
        sigma: torch.Tensor,
        cond: Conditioning,
        guidance: torch.Tensor | None,
        blocks: BlockRunner | None = None,
        control: ControlChain | None = None,
        entries: int = 1,
    ) -> torch.Tensor:
        """The network's output (model dtype) for the model input ``x_in`` of the latent batch ``shape``
        (``entries`` conditionings sharing the ControlNets ``control``)."""
        adapter = self.adapter
        sigma_b = sigma.reshape(1).expand(shape[0])
        timestep = self.ms.timestep(sigma_b)
        if self.denoise_mask is not None:
            mask = self.denoise_mask.repeat(shape[0] // self.denoise_mask.shape[0], *([1] * (len(shape) - 1)))
            timestep = adapter.process_timestep(timestep, mask)
        links = self.active_links(control, sigma)
        # the tag names the sequence: reference-image tokens lengthen it (branches may carry different references)
        tag = (tuple(shape), tuple(cond.prompt_embeds.shape), reference_count(cond), layout_tag(links, self.controls))
        self.attention.begin_forward(tag)
        residuals = None
        if links:  # the ControlNets run first, on the same split tokens; their residuals stay on this rank
            main_blocks = [adapter.block(i)[0] for i in range(adapter.num_blocks)]
            device_cond = cond.to(adapter.device, adapter.dtype)
            residuals = chain_residuals(
                links,
                self.controls,
                x_in,
                self.ms.timestep(sigma_b),
                device_cond,
                guidance,
                entries,
                self.mesh,
                self.attention,
                main_blocks,
            )
        if residuals is not None:  # added after their blocks (a cache's runner is refused with a ControlNet)
            blocks = AddResiduals(residuals)
        out = adapter.forward(x_in, timestep, cond, self.mesh, self.attention, guidance=guidance, blocks=blocks)
        self.evaluations += 1
        return out

    def layout(self, shape: tuple[int, ...]) -> tuple[list[Branch], dict[int, Placement]]:
        """The branches for a latent of ``shape`` (areas paired across the branches) and each entry's placement."""
        key = tuple(shape)
        if key not in self._layouts:
            branches = self.branches
            if any(e.region is not None for b in self._given if b is not None for e in b):
                given = [list(b) for b in self._given if b is not None]
                paired = [tuple(b) for b in pair_areas(given, (key[-2], key[-1]))]
                branches = paired[: len(self.branches)]
                for b in branches:
                    for e in b:
                        self.windows.setdefault(id(e), ActiveWindow(e, self.ms))
            placements = {id(e): place(e.region, e.strength, key, self.mesh.device) for b in branches for e in b}
            self._layouts[key] = (branches, placements)
        return self._layouts[key]

    def branch_predictions(self, x: torch.Tensor, sigma: torch.Tensor, branches: list[int]) -> list[torch.Tensor]:
        """The denoised prediction of each branch (by index) at ``sigma``: its active entries' predictions,
        each on its window, weighted by strength (and area / mask) and divided by the summed weights."""
        entries, placements = self.layout(tuple(x.shape))
        active = [(i, e) for i in branches for e in entries[i] if sigma in self.windows[id(e)]]
        sums = {i: torch.zeros_like(x) for i in branches}
        counts = {i: torch.full_like(x, COUNT_FLOOR) for i in branches}
        while active:
            first = active[0][1]
            window = placements[id(first)]
            group = [item for item in active if _joins(item[1], first, placements)]
            active = [item for item in active if not any(item is g for g in group)]
            cond = concat_conditioning(*(e.cond for _, e in group))
            guidance = None
            if self.adapter.plan.guidance_embed:
                guidance = torch.tensor([self._guidance(e) for _, e in group for _ in range(x.shape[0])])
            xw = window.crop(x)
            preds = self._forward(torch.cat([xw] * len(group)), sigma, cond, guidance, first.control, len(group))
            preds = preds.chunk(len(group))
            for (i, entry), pred in zip(group, preds):
                where = placements[id(entry)]
                weight = where.weight
                window_sum, window_count = where.crop(sums[i]), where.crop(counts[i])
                window_sum += pred * weight
                window_count += weight
        return [sums[i] / counts[i] for i in branches]

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | Guided:
        x = x.float()
        sigma = torch.as_tensor(sigma, dtype=torch.float32).reshape(())
        if not self.use_uncond:
            cond_pred = self.branch_predictions(x, sigma, [0])[0]
            return Guided(cond_pred, torch.zeros_like(cond_pred)) if self.with_uncond else cond_pred
        if self.cfg_parallel:
            branches = self.layout(tuple(x.shape))[0]
            # Each CFG rank runs its own branch, whose entries may form another number of model calls than the
            # other branch's (timestep ranges, areas): block-boundary cancel points (collective over every rank)
            # would then wait on each other, so unless each branch is one active entry they agree at the step's end.
            one_call = all(len(b) == 1 and all(sigma in self.windows[id(e)] for e in b) for b in branches)
            hook = self.adapter.block_hook
            if not one_call:
                self.adapter.block_hook = None
            try:
                pred = self.branch_predictions(x, sigma, [self.mesh.rank("cfg")])[0]
            finally:
                self.adapter.block_hook = hook
            both = all_gather_cat(pred.contiguous(), self.mesh.group("cfg"), self.mesh.stats, dim=0, op="cfg")
            cond_pred, uncond_pred = both.chunk(2, dim=0)
        else:
            cond_pred, uncond_pred = self.branch_predictions(x, sigma, [0, 1])
        guided = cfg_combine(cond_pred, uncond_pred, self.cfg)
        return Guided(guided, uncond_pred) if self.with_uncond else guided


def _joins(entry: CondEntry, first: CondEntry, placements: dict[int, Placement]) -> bool:
    """Whether ``entry`` runs in one model call with ``first``: texts that batch, the same ControlNets and window."""
    mine, theirs = placements[id(entry)], placements[id(first)]
    same_window = (mine.rows, mine.cols) == (theirs.rows, theirs.cols)
    return can_batch(entry.cond, first.cond) and same_control(entry.control, first.control) and same_window


def _per_sample(sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``sigma`` shaped to broadcast over every item of ``x`` ([B, C, (T,) H, W])."""
    return sigma.reshape(1).expand(x.shape[0]).reshape(-1, *([1] * (x.ndim - 1)))
