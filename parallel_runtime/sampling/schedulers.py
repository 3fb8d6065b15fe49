"""Noise schedules (sigma sequences) with ComfyUI's names, written from docs/sampling.md §3.

Each rule maps (model sampling, steps) to a float32 tensor of decreasing sigmas ending with 0, with
ComfyUI's numbers. ``calculate_sigmas`` is ComfyUI's function of the same name; ``sigmas_for_denoise``
is what its KSampler node uses (denoise < 1 and the samplers that drop the penultimate sigma).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy
import torch

from ..errors import ConfigError
from .model_sampling import ModelSampling
from .samplers import drops_penultimate_sigma

NEAR_ZERO = 1e-5
"""A table entry or schedule end at most this far from 0 counts as 0 (ddim_uniform, normal)."""


def _ending_with_zero(sigmas: torch.Tensor) -> torch.Tensor:
    return torch.cat([sigmas.float(), torch.zeros(1)])


def _bounds(model_sampling: ModelSampling) -> tuple[float, float]:
    return float(model_sampling.sigma_min), float(model_sampling.sigma_max)


def simple(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Table entries at evenly spaced positions from the top: ``s[T-1-floor(k*T/n)]``."""
    table = model_sampling.sigmas
    positions = torch.arange(steps, dtype=torch.float64) * (len(table) / steps)
    return _ending_with_zero(table.flip(0)[positions.floor().long()])


def sgm_uniform(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """``steps`` of ``steps + 1`` timesteps evenly spaced from the largest to the smallest sigma."""
    return _timestep_spaced(model_sampling, steps, drop_last=True)


def normal(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Timesteps evenly spaced from the largest to the smallest sigma (both included)."""
    return _timestep_spaced(model_sampling, steps, drop_last=False)


def _timestep_spaced(model_sampling: ModelSampling, steps: int, drop_last: bool) -> torch.Tensor:
    ms = model_sampling
    first, last = ms.timestep(ms.sigma_max), ms.timestep(ms.sigma_min)
    reaches_zero = not drop_last and abs(float(ms.sigma(last))) <= NEAR_ZERO
    points = steps + 1 if drop_last or reaches_zero else steps
    timesteps = torch.linspace(first, last, points)
    if drop_last:
        timesteps = timesteps[:-1]
    sigmas = torch.as_tensor(ms.sigma(timesteps)).float()
    return sigmas if reaches_zero else _ending_with_zero(sigmas)


def karras(model_sampling: ModelSampling, steps: int, rho: float = 7.0) -> torch.Tensor:
    """Karras et al. (2022): evenly spaced in ``sigma ** (1/rho)`` between sigma_max and sigma_min."""
    sigma_min, sigma_max = _bounds(model_sampling)
    low, high = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    ramp = torch.linspace(0, 1, steps)
    return _ending_with_zero((high + ramp * (low - high)) ** rho)


def exponential(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Evenly spaced in log sigma between sigma_max and sigma_min."""
    sigma_min, sigma_max = _bounds(model_sampling)
    return _ending_with_zero(torch.linspace(math.log(sigma_max), math.log(sigma_min), steps).exp())


def ddim_uniform(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Every ``T // steps``-th table entry from index 1, largest first (DDIM's uniform timesteps)."""
    table = model_sampling.sigmas
    first_is_zero = abs(float(table[1])) <= NEAR_ZERO
    stride = max(len(table) // (steps + 1 if first_is_zero else steps), 1)
    picked = table[1::stride].flip(0).float()
    return picked if first_is_zero else _ending_with_zero(picked)


def beta(model_sampling: ModelSampling, steps: int, alpha: float = 0.6, beta: float = 0.6) -> torch.Tensor:
    """Table entries at Beta(alpha, beta) quantiles (Lee et al. 2024, SciPy's quantile function as
    ComfyUI uses it); an index equal to the one before is dropped."""
    from scipy.stats import beta as beta_distribution  # imported on use: scipy.stats is slow to import

    last = len(model_sampling.sigmas) - 1
    levels = 1.0 - numpy.linspace(0.0, 1.0, steps, endpoint=False)
    indices = numpy.rint(beta_distribution.ppf(levels, alpha, beta) * last)
    keep = numpy.concatenate([[True], indices[1:] != indices[:-1]])
    return _ending_with_zero(model_sampling.sigmas[torch.from_numpy(indices[keep]).long()])


def linear_quadratic(
    model_sampling: ModelSampling, steps: int, threshold: float = 0.025, linear_steps: int | None = None
) -> torch.Tensor:
    """Mochi's schedule: 1 - u with u linear up to ``threshold`` over the first half of the steps, then
    the quadratic that meets it there (value and slope) and reaches 1; scaled by sigma_max."""
    if steps == 1:
        ramp = torch.tensor([0.0, 1.0], dtype=torch.float64)
    else:
        m = steps // 2 if linear_steps is None else linear_steps
        rest = steps - m
        gap = m - threshold * steps
        quad = gap / (m * rest**2)
        slope = threshold / m - 2 * gap / rest**2
        i = torch.arange(steps, dtype=torch.float64)
        curve = torch.where(i < m, i * threshold / m, quad * i**2 + slope * i + quad * m**2)
        ramp = torch.cat([curve, torch.ones(1, dtype=torch.float64)])
    return (1.0 - ramp).float() * model_sampling.sigma_max.cpu()


def kl_optimal(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """``tan`` of the evenly spaced points between ``atan(sigma_max)`` and ``atan(sigma_min)``."""
    if steps < 2:
        raise ConfigError(
            "the kl_optimal scheduler with 1 step",
            "its formula spaces steps by 1 / (steps - 1): ComfyUI's own kl_optimal gives NaN sigmas for 1 step",
            "use 2 or more steps, or another scheduler for a single step",
        )
    sigma_min, sigma_max = _bounds(model_sampling)
    weight = torch.arange(steps, dtype=torch.float32) / (steps - 1)
    return _ending_with_zero((weight * math.atan(sigma_min) + (1 - weight) * math.atan(sigma_max)).tan())


SCHEDULERS: Mapping[str, Callable[[ModelSampling, int], torch.Tensor]] = MappingProxyType(
    {
        "simple": simple,
        "sgm_uniform": sgm_uniform,
        "karras": karras,
        "exponential": exponential,
        "ddim_uniform": ddim_uniform,
        "beta": beta,
        "normal": normal,
        "linear_quadratic": linear_quadratic,
        "kl_optimal": kl_optimal,
    }
)
"""Scheduler rules by ComfyUI name, in ComfyUI's order."""

SCHEDULER_NAMES: list[str] = list(SCHEDULERS)
"""ComfyUI 0.3.64's ``SCHEDULER_NAMES``, same order."""


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(
            f"steps is {steps!r}",
            "a schedule needs a whole, positive number of sampling steps",
            "pass steps as an integer >= 1",
        )


def calculate_sigmas(model_sampling: ModelSampling, scheduler: str, steps: int) -> torch.Tensor:
    """The float32 sigmas (ending with 0) of the named scheduler, as ComfyUI's calculate_sigmas."""
    rule = SCHEDULERS.get(scheduler)
    if rule is None:
        raise ConfigError(
            f"unknown scheduler {scheduler!r}",
            "the schedulers are ComfyUI's, by name",
            f"use one of: {', '.join(SCHEDULER_NAMES)}",
        )
    _check_steps(steps)
    return rule(model_sampling, steps)


def _ksampler_sigmas(model_sampling: ModelSampling, scheduler: str, steps: int, drop_penultimate: bool) -> torch.Tensor:
    if not drop_penultimate:
        return calculate_sigmas(model_sampling, scheduler, steps)
    sigmas = calculate_sigmas(model_sampling, scheduler, steps + 1)
    return torch.cat([sigmas[:-2], sigmas[-1:]])


def sigmas_for_denoise(
    model_sampling: ModelSampling, scheduler: str, steps: int, denoise: float = 1.0, *, sampler: str | None = None
) -> torch.Tensor:
    """The sigmas ComfyUI's KSampler samples with for ``steps`` and ``denoise``.

    ``denoise < 1`` schedules ``int(steps / denoise)`` steps and keeps the last ``steps + 1`` sigmas;
    ``denoise <= 0`` gives no sigmas (nothing to sample). Pass ``sampler`` to apply KSampler's
    penultimate-sigma drop (dpm_2, dpm_2_ancestral, uni_pc, uni_pc_bh2).
    """
    _check_steps(steps)
    if isinstance(denoise, bool) or not isinstance(denoise, (int, float)) or math.isnan(denoise) or denoise > 1.0:
        raise ConfigError(
            f"denoise is {denoise!r}",
            "denoise is the fraction of the schedule to run, between 0 and 1",
            "pass a number in [0, 1]; 1.0 for text-to-image",
        )
    drop = sampler is not None and drops_penultimate_sigma(sampler)
    if denoise > 0.9999:
        return _ksampler_sigmas(model_sampling, scheduler, steps, drop)
    if denoise <= 0.0:
        return torch.zeros(0, dtype=torch.float32)
    sigmas = _ksampler_sigmas(model_sampling, scheduler, int(steps / denoise), drop)
    return sigmas[-(steps + 1) :]
