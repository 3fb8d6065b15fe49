"""DPM-Solver (Lu et al. 2022) in its noise-prediction form over t = -log sigma (docs/sampling.md §4.8):
dpm_fast (fixed orders 3, ..., 3, 2, 1 on a uniform t grid) and dpm_adaptive (embedded orders 2/3 with a
PID step-size controller). Both integrate from sigma_0 to the last positive sigma of the schedule."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator

import torch

from ..protocol import ModelCall, Run, SamplerGen, ask

Eval = Generator[ModelCall, torch.Tensor, torch.Tensor]


def _noise_level(t: torch.Tensor) -> torch.Tensor:
    return t.neg().exp()


def _eps(x: torch.Tensor, t: torch.Tensor, step: int, stage: int) -> Eval:
    """The model's noise estimate (x - D) / sigma at sigma = e^-t."""
    sigma = _noise_level(t)
    denoised = yield from ask(x, sigma, step, stage)
    return (x - denoised) / sigma


def _span(sigmas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(t_start, t_end): from sigma_0 to the last positive sigma."""
    last = sigmas[-1] if sigmas[-1] != 0 else sigmas[-2]
    return -sigmas[0].log(), -last.log()


def _step(x: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, order: int, index: int) -> Eval:
    """One DPM-Solver step of ``order`` (1, 2 with r1 = 1/2, 3 with r1 = 1/3, r2 = 2/3)."""
    h = t_next - t
    eps = yield from _eps(x, t, index, 0)
    base = x - _noise_level(t_next) * h.expm1() * eps
    if order == 1:
        return base
    r1 = 0.5 if order == 2 else 1 / 3
    s1 = t + r1 * h
    eps_1 = yield from _eps(x - _noise_level(s1) * (r1 * h).expm1() * eps, s1, index, 1)
    if order == 2:
        return base - _noise_level(t_next) / (2 * r1) * h.expm1() * (eps_1 - eps)
    return (yield from _third_order(x, t, h, eps, eps_1, base, t_next, index))


def _third_order(
    x: torch.Tensor,
    t: torch.Tensor,
    h: torch.Tensor,
    eps: torch.Tensor,
    eps_1: torch.Tensor,
    base: torch.Tensor,
    t_next: torch.Tensor,
    index: int,
) -> Eval:
    r1, r2 = 1 / 3, 2 / 3
    s2 = t + r2 * h
    growth = (r2 * h).expm1()
    u2 = x - _noise_level(s2) * growth * eps - _noise_level(s2) * (r2 / r1) * (growth / (r2 * h) - 1) * (eps_1 - eps)
    eps_2 = yield from _eps(u2, s2, index, 2)
    return base - _noise_level(t_next) / r2 * (h.expm1() / h - 1) * (eps_2 - eps)


def dpm_fast(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """As many model calls as steps: ``floor(n/3) + 1`` intervals uniform in t, orders 3,...,3 then 2,1 or n mod 3."""
    if len(sigmas) <= 1:
        return x
    calls = len(sigmas) - 1
    t_start, t_end = _span(sigmas)
    intervals = calls // 3 + 1
    grid = torch.linspace(t_start, t_end, intervals + 1)
    tail = [2, 1] if calls % 3 == 0 else [calls % 3]
    orders = [3] * (intervals - len(tail)) + tail
    for i, order in enumerate(orders):
        x = yield from _step(x, grid[i], grid[i + 1], order, i)
    return x


@dataclasses.dataclass
class StepSizeController:
    """A PID controller on the inverse error (Söderlind); ``propose`` updates the step and says whether
    the tried step is accepted."""

    h: float
    p: float
    i: float
    d: float
    order: float
    accept_safety: float = 0.81
    eps: float = 1e-8
    history: list[float] = dataclasses.field(default_factory=list)

    def propose(self, error: float) -> bool:
        inverse = 1 / (error + self.eps)
        if not self.history:
            self.history = [inverse] * 3
        self.history[0] = inverse
        exponents = ((self.p + self.i + self.d) / self.order, -(self.p + 2 * self.d) / self.order, self.d / self.order)
        factor = math.prod(v**e for v, e in zip(self.history, exponents))
        factor = 1 + math.atan(factor - 1)
        accepted = factor >= self.accept_safety
        if accepted:
            self.history = [self.history[0], self.history[0], self.history[1]]
        self.h *= factor
        return accepted


def _embedded_pair(x: torch.Tensor, s: torch.Tensor, t: torch.Tensor, order: int, index: int) -> Generator:
    """(lower-order, higher-order) results of one step, sharing their model calls."""
    h = t - s
    eps = yield from _eps(x, s, index, 0)
    first = x - _noise_level(t) * h.expm1() * eps
    r1 = 0.5 if order == 2 else 1 / 3
    s1 = s + r1 * h
    eps_1 = yield from _eps(x - _noise_level(s1) * (r1 * h).expm1() * eps, s1, index, 1)
    second = first - _noise_level(t) / (2 * r1) * h.expm1() * (eps_1 - eps)
    if order == 2:
        return first, second
    third = yield from _third_order(x, s, h, eps, eps_1, first, t, index)
    return second, third


@dataclasses.dataclass(frozen=True)
class AdaptiveSettings:
    """dpm_adaptive's knobs with ComfyUI's defaults (a SamplerDPMAdaptative node sets them)."""

    order: int = 3
    rtol: float = 0.05
    atol: float = 0.0078
    h_init: float = 0.05
    pid: tuple[float, float, float] = (0.0, 1.0, 0.0)
    accept_safety: float = 0.81


def dpm_adaptive(
    x: torch.Tensor, sigmas: torch.Tensor, run: Run, settings: AdaptiveSettings = AdaptiveSettings()
) -> SamplerGen:
    """Embedded DPM-Solver-2/3 steps, each tried step judged by the scaled RMS difference of the pair."""
    if len(sigmas) <= 1:
        return x
    s, t_end = _span(sigmas)
    controller = StepSizeController(settings.h_init, *settings.pid, settings.order, settings.accept_safety)
    floor, relative = torch.tensor(settings.atol), torch.tensor(settings.rtol)
    x_prev, tries = x, 0
    while s < t_end - 1e-5:
        t = torch.minimum(t_end, s + controller.h)
        low, high = yield from _embedded_pair(x, s, t, settings.order, tries)
        scale = torch.maximum(floor, relative * torch.maximum(low.abs(), x_prev.abs()))
        error = torch.linalg.norm((low - high) / scale) / x.numel() ** 0.5
        if controller.propose(float(error)):
            x_prev, x, s = low, high, t
        tries += 1
    return x
