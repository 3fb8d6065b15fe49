"""ComfyUI's EasyCache and LazyCache: skip a model evaluation while the output is predicted to change little.

The numbers are ComfyUI 0.3.64's (``comfy_extras/nodes_easycache.py``); this is our own form of its rule:

- Every measure is a mean absolute value over every 8th latent pixel along the last two axes ("sub"):
  input change ``dx = mean|sub(x) - sub(x_prev)|``, output change ``dy = mean|sub(y) - sub(y_prev)|``, with
  ``x_prev`` / ``y_prev`` the input and output of the last evaluation that ran; and the output's size
  ``|y_prev| = mean|y_prev|`` over the whole output (not subsampled).
- After an evaluation that ran with a known ``dx``, the transformation rate ``k = dy / dx`` is kept.
- Before an evaluation inside the window, the estimated relative output change ``k * dx / |y_prev|`` is
  added to a running sum; while the sum stays below ``reuse_threshold`` the evaluation is skipped and its
  output is ``x + (y_prev - x_prev)`` (the last output's difference to its input); once it reaches the
  threshold the evaluation runs and the sum starts again from 0.
- The window: the rule acts from ``sigma <= sigma(start_percent)``; from ``sigma <= sigma(end_percent)`` on
  every evaluation runs and nothing is recorded. Before the window evaluations run and are recorded.

EasyCache measures around each model call (input: the model input, output: the raw model output). Its
reference is the first conditioning entry of the first call in the window, in ComfyUI's batch order (the
negative one when the two branches run as one batch, the positive one with cfg 1); ``|y_prev|`` is taken
over the whole call (both branches), and a skip decided on that call applies to every call of the step.
LazyCache measures around the guided prediction (input: the sampler's x, output: the denoised prediction).

Two more ComfyUI details, kept so graphs give ComfyUI's picture. A reused EasyCache call adds the cached
difference of *every* entry of the call to the whole batched input (so with cond and uncond batched both get
``x + d_cond + d_uncond``; under CFG parallel the two ranks add up their differences once per computed call).
And it adds them in place: when the model computes in float32 and its input is the noisy latent itself (flow
models, no concatenated image), that input *is* the tensor ComfyUI then turns into the denoised prediction,
so a reused call's prediction is ``y * (1 - sigma)`` instead of ``x - y * sigma`` (:attr:`EasyCache.reused`
tells the denoiser when this applies); bf16 / fp16 models get a copy and the usual formula.

Every mean is a global one (:mod:`.decisions`), so every rank takes the same decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence

import torch

from ...sampling import ModelSampling
from .decisions import DecisionGroup, abs_sum
from .specs import SUBSAMPLE, StepCacheSpec

log = logging.getLogger(__name__)

Key = Hashable  # a conditioning entry (its branch and place in it)


def subsampled(t: torch.Tensor) -> torch.Tensor:
    """Every SUBSAMPLE-th value along the last two axes (the latent's height and width)."""
    return t[..., ::SUBSAMPLE, ::SUBSAMPLE]


class ChangeRule:
    """The state both caches share: the window, the transformation rate and the running sum."""

    def __init__(self, spec: StepCacheSpec, model_sampling: ModelSampling, group: DecisionGroup):
        self.spec, self.group = spec, group
        self.start_sigma = model_sampling.percent_to_sigma(spec.start_percent)
        self.end_sigma = model_sampling.percent_to_sigma(spec.end_percent)
        self.rate: float | None = None  # k = dy / dx of the last evaluation that ran with a known dx
        self.running = 0.0  # sum of the estimated relative output changes since the last evaluation that ran
        self.x_prev: torch.Tensor | None = None  # this rank's share of sub(x) at the last recorded evaluation
        self.y_prev: torch.Tensor | None = None  # its share of sub(y) (None where this rank does not hold y)
        self.y_prev_size: float | None = None  # mean |y| of that evaluation (global)
        self.evaluations = 0
        self.skipped = 0
        self.trace: list[tuple[int, bool]] = []  # (evaluation number, skipped) inside the window

    # -- the window (compared as ComfyUI compares: the float32 sigma against a Python float) ------------------
    def past_end(self, sigma: torch.Tensor) -> bool:
        return not bool(sigma.float().reshape(-1)[0] > self.end_sigma)

    def in_window(self, sigma: torch.Tensor) -> bool:
        return bool(sigma.float().reshape(-1)[0] <= self.start_sigma)

    # -- measures ---------------------------------------------------------------------------------------------
    def input_change(self, x_share: torch.Tensor) -> float:
        """mean |sub(x) - sub(x_prev)| over every rank's share."""
        assert self.x_prev is not None
        total, count = self.group.sums([abs_sum(x_share - self.x_prev), x_share.numel()])
        return total / count if count else 0.0

    def reuse(self, dx: float) -> bool:
        """Add the estimated relative output change; True while the sum stays below the threshold."""
        if self.y_prev_size is None or self.rate is None:
            return False
        self.running += self.rate * dx / self.y_prev_size if self.y_prev_size else float("inf")
        if self.running < self.spec.reuse_threshold:
            self._say("skipping", dx)
            return True
        self._say("computing", dx)
        self.running = 0.0
        return False

    def record(
        self,
        dx: float | None,
        x_share: torch.Tensor,
        y_sub_share: torch.Tensor | None,
        y_shares: Sequence[torch.Tensor],
    ) -> None:
        """After an evaluation that ran: update the rate and keep this evaluation's input and output.
        ``y_sub_share``: this rank's share of the reference output, subsampled (None if it holds none of it);
        ``y_shares``: its shares of every output whose size counts."""
        had_prev = self.y_prev_size is not None
        change = count = 0.0
        if had_prev and y_sub_share is not None and self.y_prev is not None:
            change, count = abs_sum(y_sub_share - self.y_prev), y_sub_share.numel()
        size = sum((abs_sum(y) for y in y_shares), torch.zeros((), dtype=torch.float64, device=x_share.device))
        change, count, size, size_count = self.group.sums([change, count, size, sum(y.numel() for y in y_shares)])
        if had_prev and dx is not None and dx > 0 and count:
            self.rate = (change / count) / dx
        self.x_prev = x_share.clone()
        self.y_prev = None if y_sub_share is None else y_sub_share.clone()
        self.y_prev_size = size / size_count if size_count else 0.0

    def _say(self, what: str, dx: float) -> None:
        if self.spec.verbose:
            log.info(
                "%s: %s evaluation %d; accumulated change %.6g, threshold %.6g (input change %.6g)",
                self.spec.name,
                what,
                self.evaluations,
                self.running,
                self.spec.reuse_threshold,
                dx,
            )

    def summary(self) -> dict:
        calls = self.evaluations
        ran = calls - self.skipped
        return {
            "cache": self.spec.name,
            "evaluations": calls,
            "skipped": self.skipped,
            "speedup": calls / ran if ran else 1.0,
            "trace": list(self.trace),
        }


class EasyCache:
    """ComfyUI's EasyCache over one generation: decides per model call (see the module doc)."""

    def __init__(self, spec: StepCacheSpec, model_sampling: ModelSampling, group: DecisionGroup):
        self.rule = ChangeRule(spec, model_sampling, group)
        self.group = group
        self.reference: Key | None = None  # the entry whose input and output are measured
        self.differences: dict[tuple[Key, ...], torch.Tensor] = {}  # per call: the sum over its entries of
        # output - input at its last run (every rank holds the whole sum)
        self.skip_step = False
        self.reused = False  # the last call's outputs are the cached differences added to its input

    def begin_evaluation(self) -> None:
        """A new guided evaluation starts (one or more model calls)."""
        self.skip_step = False
        self.rule.evaluations += 1

    def call(
        self,
        sigma: torch.Tensor,
        keys: Sequence[Key],
        local: Sequence[Key],
        x_in: torch.Tensor,
        run: Callable[[], Sequence[torch.Tensor]],
    ) -> list[torch.Tensor]:
        """Outputs of one model call (``keys``: its entries in ComfyUI's batch order; ``local``: those this
        rank evaluates, in the order ``run`` returns their outputs; ``x_in``: the model input of one entry,
        in the model's dtype). ``run`` computes this rank's outputs."""
        rule = self.rule
        self.reused = False
        if rule.past_end(sigma):
            return list(run())
        measured = self.reference is not None and self.reference in keys
        reusable = tuple(keys) in self.differences  # this call ran before (the same on every rank)
        dx = None
        x_share = None
        if rule.in_window(sigma):
            if self.skip_step and reusable:
                return self._reuse(keys, local, x_in)
            if self.reference is None:
                self.reference, measured = keys[0], True
            if measured:
                x_share = self.group.share(subsampled(x_in), "stage")
                if rule.x_prev is not None:
                    dx = rule.input_change(x_share)
                    if rule.reuse(dx) and reusable:
                        self.skip_step = True
                        rule.skipped += 1
                        rule.trace.append((rule.evaluations, True))
                        return self._reuse(keys, local, x_in)
                    rule.running = 0.0 if not reusable else rule.running
                rule.trace.append((rule.evaluations, False))
        outputs = list(run())
        if measured:
            if x_share is None:
                x_share = self.group.share(subsampled(x_in), "stage")
            ref = outputs[list(local).index(self.reference)] if self.reference in local else None
            ref_share = None if ref is None else self.group.share(subsampled(ref), "sp")
            rule.record(dx, x_share, ref_share, [self.group.share(y, "sp") for y in outputs])
        mine = sum((y - x_in for y in outputs), torch.zeros_like(x_in))
        self.differences[tuple(keys)] = self.group.sum_over_branches(mine)
        return outputs

    def _reuse(self, keys: Sequence[Key], local: Sequence[Key], x_in: torch.Tensor) -> list[torch.Tensor]:
        self.reused = True
        out = x_in + self.differences[tuple(keys)]
        return [out] * len(local)

    def summary(self) -> dict:
        return self.rule.summary()


class LazyCache:
    """ComfyUI's LazyCache over one generation: decides per guided evaluation (see the module doc)."""

    def __init__(self, spec: StepCacheSpec, model_sampling: ModelSampling, group: DecisionGroup):
        self.rule = ChangeRule(spec, model_sampling, group)
        self.group = group
        self.difference: torch.Tensor | None = None

    def __call__(
        self, x: torch.Tensor, sigma: torch.Tensor, predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        rule = self.rule
        rule.evaluations += 1
        if rule.past_end(sigma):
            return predict(x, sigma)
        x_share = self.group.share(subsampled(x), "stage")
        dx = None
        if rule.in_window(sigma):
            if rule.x_prev is not None:
                dx = rule.input_change(x_share)
                if rule.reuse(dx):
                    rule.skipped += 1
                    rule.trace.append((rule.evaluations, True))
                    assert self.difference is not None
                    return x + self.difference
            rule.trace.append((rule.evaluations, False))
        y = predict(x, sigma)
        rule.record(dx, x_share, self.group.share(subsampled(y), "stage"), [self.group.share(y, "stage")])
        self.difference = y - x
        return y

    def summary(self) -> dict:
        return self.rule.summary()
