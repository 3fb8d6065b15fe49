"""Steps of the probability-flow ODE in sigma (docs/sampling.md §4.1, §4.4): euler, heun, heunpp2,
dpm_2 (Karras et al. 2022) and gradient estimation (Permenter & Yuan 2023)."""

from __future__ import annotations

import torch

from ..protocol import Run, SamplerGen, ask, ask_guided
from ..trajectory import derivative


def euler(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """``x <- x + (sigma_{i+1} - sigma_i) d``."""
    for i, (sigma, dt) in enumerate(zip(sigmas[:-1], sigmas.diff())):
        denoised = yield from ask(x, sigma, i)
        x = x + derivative(x, sigma, denoised) * dt
    return x


def heun(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """The trapezoid rule: average the slopes at both ends of an Euler step (Euler onto sigma 0)."""
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        dt = target - sigma
        slope = derivative(x, sigma, (yield from ask(x, sigma, i)))
        predicted = x + slope * dt
        if target == 0:
            x = predicted
            continue
        slope_there = derivative(predicted, target, (yield from ask(predicted, target, i, 1)))
        x = x + (slope + slope_there) / 2 * dt
    return x


def dpm_2(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """The midpoint rule with the midpoint taken in log sigma (Euler onto sigma 0)."""
    midpoints = sigmas[:-1].log().lerp(sigmas[1:].log(), 0.5).exp()
    for i, (sigma, target, middle) in enumerate(zip(sigmas[:-1], sigmas[1:], midpoints)):
        slope = derivative(x, sigma, (yield from ask(x, sigma, i)))
        if target == 0:
            x = x + slope * (target - sigma)
            continue
        halfway = x + slope * (middle - sigma)
        x = x + derivative(halfway, middle, (yield from ask(halfway, middle, i, 1))) * (target - sigma)
    return x


def heunpp2(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """Heun++: slopes at up to three points of an Euler chain ahead, weighted by ``sigma_k / (K sigma_0)``."""
    end, first = sigmas[-1], sigmas[0]
    for i in range(len(sigmas) - 1):
        dt = sigmas[i + 1] - sigmas[i]
        ahead = 1 if sigmas[i + 1] == end else 2 if sigmas[i + 2] == end else 3  # points the chain visits
        point, slopes = x, []
        for k in range(ahead):
            sigma = sigmas[i + k]
            slopes.append(derivative(point, sigma, (yield from ask(point, sigma, i, k))))
            if k + 1 < ahead:
                point = point + slopes[-1] * (sigmas[i + k + 1] - sigma)
        later = [sigmas[i + k] / (ahead * first) for k in range(1, ahead)]
        own = 1.0
        for w in later:
            own = own - w
        combined = slopes[0] * own
        for w, s in zip(later, slopes[1:]):
            combined = combined + s * w
        x = x + combined * dt
    return x


def gradient_estimation(
    x: torch.Tensor, sigmas: torch.Tensor, run: Run, *, cfg_pp: bool = False, gamma: float = 2.0
) -> SamplerGen:
    """Euler plus ``(gamma - 1)`` times the change of the slope since the last step (CFG++: the slope
    from the unconditional prediction, the step from the guided one)."""
    previous: torch.Tensor | None = None
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        if cfg_pp:
            denoised, uncond = yield from ask_guided(x, sigma, i)
            slope = derivative(x, sigma, uncond)
        else:
            denoised = yield from ask(x, sigma, i)
            slope = derivative(x, sigma, denoised)
        dt = target - sigma
        if target == 0:
            x = denoised
        else:
            x = denoised + slope * target if cfg_pp else x + slope * dt
            if previous is not None:
                x = x + (gamma - 1) * (slope - previous) * dt
        previous = slope
    return x
