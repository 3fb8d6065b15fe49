"""Noise schedules (sigma sequences) with ComfyUI's names and math (comfy.samplers / k_diffusion).

Every schedule ends with sigma 0 and is float32, like ComfyUI's. ``calculate_sigmas`` is ComfyUI's
function of the same name; ``sigmas_for_denoise`` is what its KSampler node uses (denoise < 1 and the
samplers that drop the penultimate sigma).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy
import torch

from ..errors import ConfigError
from .model_sampling import ModelSampling


def _to_sigmas(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _append_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_zeros([1])])


def simple_scheduler(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Evenly strided entries of the model's sigma table, from the top."""
    table = model_sampling.sigmas
    stride = len(table) / steps
    return _to_sigmas([float(table[-(1 + int(x * stride))]) for x in range(steps)] + [0.0])


def ddim_uniform_scheduler(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Every ``len(table) // steps``-th table entry starting at index 1, reversed (DDIM's uniform spacing)."""
    table = model_sampling.sigmas
    x = 1
    if math.isclose(float(table[x]), 0, abs_tol=0.00001):
        steps += 1
        sigs: list[float] = []
    else:
        sigs = [0.0]
    stride = max(len(table) // steps, 1)
    while x < len(table):
        sigs.append(float(table[x]))
        x += stride
    return _to_sigmas(sigs[::-1])


def normal_scheduler(model_sampling: ModelSampling, steps: int, sgm: bool = False) -> torch.Tensor:
    """Sigmas at timesteps evenly spaced between the model's largest and smallest timestep."""
    ms = model_sampling
    start = ms.timestep(ms.sigma_max)
    end = ms.timestep(ms.sigma_min)
    append_zero = True
    if sgm:
        timesteps = torch.linspace(start, end, steps + 1)[:-1]
    else:
        if math.isclose(float(ms.sigma(end)), 0, abs_tol=0.00001):
            steps += 1
            append_zero = False
        timesteps = torch.linspace(start, end, steps)
    sigs = [float(ms.sigma(ts)) for ts in timesteps]
    if append_zero:
        sigs.append(0.0)
    return _to_sigmas(sigs)


def sgm_uniform_scheduler(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Like ``normal`` but over ``steps + 1`` points with the last (smallest) one dropped."""
    return normal_scheduler(model_sampling, steps, sgm=True)


def karras_scheduler(model_sampling: ModelSampling, steps: int, rho: float = 7.0) -> torch.Tensor:
    """Karras et al. (2022): linear in ``sigma ** (1/rho)`` between sigma_max and sigma_min."""
    sigma_min, sigma_max = float(model_sampling.sigma_min), float(model_sampling.sigma_max)
    ramp = torch.linspace(0, 1, steps)
    min_inv_rho = sigma_min ** (1 / rho)
    max_inv_rho = sigma_max ** (1 / rho)
    return _append_zero((max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho)


def exponential_scheduler(model_sampling: ModelSampling, steps: int) -> torch.Tensor:
    """Linear in log sigma between sigma_max and sigma_min."""
    sigma_min, sigma_max = float(model_sampling.sigma_min), float(model_sampling.sigma_max)
    return _append_zero(torch.linspace(math.log(sigma_max), math.log(sigma_min), steps).exp())


def beta_scheduler(model_sampling: ModelSampling, steps: int, alpha: float = 0.6, beta: float = 0.6) -> torch.Tensor:
    """Table entries at Beta(alpha, beta) quantiles (arXiv 2407.12173), with scipy's quantile
    function as ComfyUI uses it; repeated entries are dropped."""
    from scipy.stats import beta as beta_distribution  # imported on use: scipy.stats is slow to import

    total = len(model_sampling.sigmas) - 1
    quantiles = 1.0 - numpy.linspace(0.0, 1.0, steps, endpoint=False)
    indices = numpy.rint(beta_distribution.ppf(quantiles, alpha, beta) * total)
    sigs: list[float] = []
    for k, index in enumerate(indices):
        if k == 0 or index != indices[k - 1]:
            sigs.append(float(model_sampling.sigmas[int(index)]))
    return _to_sigmas(sigs + [0.0])


SCHEDULERS: Mapping[str, Callable[[ModelSampling, int], torch.Tensor]] = MappingProxyType(
    {
        "simple": simple_scheduler,
        "sgm_uniform": sgm_uniform_scheduler,
        "karras": karras_scheduler,
        "exponential": exponential_scheduler,
        "ddim_uniform": ddim_uniform_scheduler,
        "beta": beta_scheduler,
        "normal": normal_scheduler,
    }
)
"""Scheduler functions by ComfyUI name."""

SCHEDULER_NAMES: tuple[str, ...] = tuple(SCHEDULERS)

DISCARD_PENULTIMATE_SIGMA_SAMPLERS: frozenset[str] = frozenset({"dpm_2"})
"""Samplers for which ComfyUI's KSampler computes one extra step and drops the second-to-last sigma."""


def _check_steps(steps: int) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(
            f"steps is {steps!r}",
            "a schedule needs a whole, positive number of sampling steps",
            "pass steps as an integer >= 1",
        )


def calculate_sigmas(model_sampling: ModelSampling, scheduler: str, steps: int) -> torch.Tensor:
    """``steps + 1`` float32 sigmas (ending with 0) of the named scheduler, as ComfyUI's calculate_sigmas."""
    handler = SCHEDULERS.get(scheduler)
    if handler is None:
        raise ConfigError(
            f"unknown scheduler {scheduler!r}",
            "only schedulers that reproduce ComfyUI's math are implemented",
            f"use one of: {', '.join(SCHEDULER_NAMES)}",
        )
    _check_steps(steps)
    return handler(model_sampling, steps)


def _ksampler_sigmas(model_sampling: ModelSampling, scheduler: str, steps: int, sampler: str | None) -> torch.Tensor:
    if sampler in DISCARD_PENULTIMATE_SIGMA_SAMPLERS:
        sigmas = calculate_sigmas(model_sampling, scheduler, steps + 1)
        return torch.cat([sigmas[:-2], sigmas[-1:]])
    return calculate_sigmas(model_sampling, scheduler, steps)


def sigmas_for_denoise(
    model_sampling: ModelSampling, scheduler: str, steps: int, denoise: float = 1.0, *, sampler: str | None = None
) -> torch.Tensor:
    """The sigmas ComfyUI's KSampler samples with for ``steps`` and ``denoise``.

    ``denoise < 1`` schedules ``int(steps / denoise)`` steps and keeps the last ``steps + 1`` sigmas;
    ``denoise <= 0`` gives no sigmas (nothing to sample). Pass ``sampler`` to apply KSampler's
    penultimate-sigma drop for ``dpm_2``.
    """
    _check_steps(steps)
    if isinstance(denoise, bool) or not isinstance(denoise, (int, float)) or math.isnan(denoise) or denoise > 1.0:
        raise ConfigError(
            f"denoise is {denoise!r}",
            "denoise is the fraction of the schedule to run, between 0 and 1",
            "pass a number in [0, 1]; 1.0 for text-to-image",
        )
    if denoise > 0.9999:
        return _ksampler_sigmas(model_sampling, scheduler, steps, sampler)
    if denoise <= 0.0:
        return torch.zeros(0, dtype=torch.float32)
    sigmas = _ksampler_sigmas(model_sampling, scheduler, int(steps / denoise), sampler)
    return sigmas[-(steps + 1) :]
