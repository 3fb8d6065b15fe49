"""PipeFusion schedule: patches (row bands), model-evaluation rounds, work items and time slots.

Everything here is a pure function of the settings, so every rank computes the same schedule on
its own and no rank ever waits for a message that is not coming.

- A *round* is one model evaluation of the whole latent as the sampler asks for it (one per step,
  two or three for the steps of heun, dpm_2, seeds_3, ...). A dry run of the sampler on a 1-element latent lists them.
- An *item* is what flows through the pipeline: the whole image for the warmup rounds (steps
  ``< warmup``), else one patch. Items are numbered in the order every stage processes them.
- A *slot* is one tick of the lockstep: at slot ``t`` stage ``s`` processes at most one item; at
  the end of the slot in which the last stage finishes a step, every rank joins the cancel agreement. Slots come from list scheduling with the dependencies
  item ``k`` at stage ``s - 1`` (activations), item ``k - 1`` at stage ``s`` (one item at a time)
  and, on stage 0, the items of the previous round that produce this item's latent at the last
  stage (the sampler step). With ``patches >= pp`` the steady state has no bubble: the pipeline
  fills once per generation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from ..errors import ConfigError
from ..parallel.sharding import split_sizes
from ..sampling import Guided, ModelSampling, SamplerSpec, sampler_spec, sampler_steps


@dataclasses.dataclass(frozen=True)
class Band:
    """A band of token rows ``rows[0]:rows[1]`` of a ``grid`` (token rows, cols) image."""

    index: int | None  # patch number; None for the whole image
    rows: tuple[int, int]
    cols: int

    @property
    def token_range(self) -> tuple[int, int]:
        """Range of the band's tokens in the row-major token sequence of the whole image."""
        return self.rows[0] * self.cols, self.rows[1] * self.cols

    @property
    def num_tokens(self) -> int:
        return (self.rows[1] - self.rows[0]) * self.cols

    def latent_rows(self, patch_size: int) -> tuple[int, int]:
        return self.rows[0] * patch_size, self.rows[1] * patch_size

    @property
    def key(self) -> str:
        return "whole" if self.index is None else f"patch{self.index}"


def default_patches(pp: int, token_rows: int) -> int:
    """Patches used when none are given: two per stage (fills the pipeline with a half-patch bubble
    and keeps patches big enough for efficient kernels), at most one per token row."""
    return max(pp, min(2 * pp, token_rows))


def patch_bands(token_rows: int, cols: int, patches: int, pp: int) -> list[Band]:
    """``patches`` row bands (balanced: sizes differ by at most one token row)."""
    if isinstance(patches, bool) or not isinstance(patches, int) or patches < 1:
        raise ConfigError(
            f"PipeFusion patches = {patches!r}",
            "the latent is split into that many row bands",
            f"use a whole number >= the {pp} pipeline stages, or leave it unset",
        )
    if patches < pp:
        raise ConfigError(
            f"{patches} PipeFusion patches for {pp} pipeline stages",
            "every stage must have a patch to work on, or the pipeline stalls on each step",
            f"use at least {pp} patches (or leave it unset: {default_patches(pp, token_rows)})",
        )
    if patches > token_rows:
        raise ConfigError(
            f"{patches} PipeFusion patches for an image of {token_rows} token rows",
            "a patch is a band of whole token rows (the model's patch size), so there are at most as many patches as rows",
            f"use at most {token_rows} patches, or a taller image",
        )
    bands, start = [], 0
    for i, n in enumerate(split_sizes(token_rows, patches)):
        bands.append(Band(i, (start, start + n), cols))
        start += n
    return bands


@dataclasses.dataclass(frozen=True)
class Round:
    """One model evaluation the sampler asks for (the same for every patch)."""

    step: int
    stage: int  # 0: first evaluation of the step; 1, 2: the later ones (heun, seeds_3, dpm_fast, ...)
    sigma: float


def require_per_patch(sampler: str) -> SamplerSpec:
    """The sampler's table entry, or a clear error if it cannot run patch by patch."""
    spec = sampler_spec(sampler)
    if not spec.per_patch:
        raise ConfigError(
            f"the {sampler} sampler with PipeFusion",
            f"{sampler} chooses its step sizes from an error norm over the whole latent, so PipeFusion's "
            "patches would each take their own steps and the stages could not agree on a schedule",
            "choose another sampler (e.g. dpm_fast, dpmpp_2m or uni_pc), or a layout without PipeFusion "
            f"(Ulysses / Ring / CFG parallel run {sampler})",
        )
    return spec


def sampler_rounds(
    sampler: str,
    sigmas: torch.Tensor,
    model_sampling: ModelSampling,
    eta: float | None = None,
    s_noise: float | None = None,
) -> list[Round]:
    """The model evaluations ``sampler`` makes over ``sigmas`` (a dry run on a 1-element latent).

    Which evaluations a sampler makes depends only on the schedule for every sampler that works patch
    by patch (its table entry says so); the others are refused here."""
    spec = require_per_patch(sampler)
    x = torch.zeros(1, 1, 1, 1)

    def no_noise(sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)

    noise = no_noise if spec.noise is not None else None
    gen = sampler_steps(sampler, x, sigmas, noise, model_sampling=model_sampling, eta=eta, s_noise=s_noise)
    rounds = []
    try:
        call = next(gen)
        while True:
            rounds.append(Round(call.step, call.stage, float(call.sigma)))
            zero = torch.zeros_like(call.x)
            call = gen.send(Guided(zero, zero) if spec.cfg_pp else zero)
    except StopIteration:
        pass
    return rounds


@dataclasses.dataclass(frozen=True)
class Item:
    """One unit of pipeline work: round ``round`` of ``band``."""

    index: int
    round: int
    band: Band
    deps: tuple[int, ...]  # items of the previous round whose sampler steps produce this item's latent


@dataclasses.dataclass(frozen=True)
class PipelineSchedule:
    """Items in processing order and, per stage, the item of every slot (None: idle)."""

    items: tuple[Item, ...]
    rounds: tuple[Round, ...]
    bands: tuple[Band, ...]  # the patch bands (also used to keep per-patch sampler state)
    whole: Band
    slots: tuple[tuple[int | None, ...], ...]  # slots[stage][t]
    warmup_rounds: int

    @property
    def num_slots(self) -> int:
        return len(self.slots[0])

    def stage_items(self, stage: int) -> list[int]:
        return [k for k in self.slots[stage] if k is not None]

    def dependents(self) -> dict[int, list[int]]:
        """item -> the next-round items that need it (in item order)."""
        out: dict[int, list[int]] = {}
        for item in self.items:
            for d in item.deps:
                out.setdefault(d, []).append(item.index)
        return out

    def last_item_of_step(self) -> dict[int, int]:
        """step -> index of the last item that belongs to it."""
        out: dict[int, int] = {}
        for item in self.items:
            out[self.rounds[item.round].step] = item.index
        return out

    def step_end_slots(self) -> set[int]:
        """Slots in which the last stage finishes a sampling step's last item (where ranks agree on cancel)."""
        ends = set(self.last_item_of_step().values())
        return {t for t, k in enumerate(self.slots[-1]) if k in ends}

    def bubble_fraction(self) -> float:
        """Idle share of the stages' time if a slot lasts as long as its biggest item (work ~ tokens)."""
        pp = len(self.slots)
        busy = total = 0
        for t in range(self.num_slots):
            work = [0 if st[t] is None else self.items[st[t]].band.num_tokens for st in self.slots]
            busy += sum(work)
            total += max(work) * pp
        return 1.0 - busy / total if total else 0.0


def build_schedule(
    rounds: Sequence[Round], grid: tuple[int, int], patches: int, pp: int, warmup: int
) -> PipelineSchedule:
    """Items and lockstep slots for ``rounds`` on a ``grid`` (token rows, cols) image.

    Rounds of steps ``< warmup`` run the whole image; the others run ``patches`` row bands."""
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(
            f"PipeFusion warmup = {warmup!r}",
            "warmup counts the first sampling steps that run synchronously on the whole image",
            "use a whole number >= 0 (1 is a good default)",
        )
    rows, cols = grid
    bands = patch_bands(rows, cols, patches, pp)
    whole = Band(None, (0, rows), cols)
    items: list[Item] = []
    previous: list[Item] = []
    warm = 0
    for r, rnd in enumerate(rounds):
        current: list[Item] = []
        if rnd.step < warmup:
            warm += 1
            current.append(Item(len(items), r, whole, tuple(i.index for i in previous)))
            items.append(current[-1])
        else:
            for band in bands:
                deps = tuple(i.index for i in previous if _overlap(i.band, band))
                current.append(Item(len(items), r, band, deps))
                items.append(current[-1])
        previous = current
    finish: dict[tuple[int, int], int] = {}
    for item in items:
        k = item.index
        for s in range(pp):
            t = 0
            if k > 0:
                t = max(t, finish[(k - 1, s)] + 1)
            if s > 0:
                t = max(t, finish[(k, s - 1)] + 1)
            else:
                for d in item.deps:
                    t = max(t, finish[(d, pp - 1)] + 1)
            finish[(k, s)] = t
    num_slots = (max(finish.values()) + 1) if finish else 0
    table: list[list[int | None]] = [[None] * num_slots for _ in range(pp)]
    for (k, s), t in finish.items():
        table[s][t] = k
    return PipelineSchedule(tuple(items), tuple(rounds), tuple(bands), whole, tuple(tuple(row) for row in table), warm)


def _overlap(a: Band, b: Band) -> bool:
    return a.rows[0] < b.rows[1] and b.rows[0] < a.rows[1]


def receive_plan(sched: PipelineSchedule, stage: int) -> dict[int, list[int]]:
    """slot -> items whose message to ``stage`` is sent in that slot (-1: during setup).

    A receive is posted at the start of the slot in which its sender sends, so it overlaps the
    sender's compute, and at a cancel (agreed at the end of a slot) every posted receive has
    its send: nothing is left in flight for the next job."""
    plan: dict[int, list[int]] = {}
    if stage == 0:  # latents from the last stage, sent when all of an item's deps are done
        when = {k: t for t, k in enumerate(sched.slots[-1]) if k is not None}
        for item in sched.items:
            t = max((when[d] for d in item.deps), default=-1)
            plan.setdefault(t, []).append(item.index)
    else:  # activations from the previous stage, sent in the slot it computes them
        for t, k in enumerate(sched.slots[stage - 1]):
            if k is not None:
                plan.setdefault(t, []).append(k)
    return plan
