"""Model sampling objects: how a model's noise level (sigma) maps to its timestep, input and output.

Same math as ComfyUI's ``comfy.model_sampling``: ``DiscreteEpsSampling`` is ``ModelSamplingDiscrete`` +
``EPS`` (PixArt), ``DiscreteFlowSampling`` is ``ModelSamplingDiscreteFlow`` + ``CONST`` (SD3) and
``FluxFlowSampling`` is ``ModelSamplingFlux`` + ``CONST`` (Flux). Every sigma table is float32, as in
ComfyUI, so schedulers built on it give the same numbers.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from ..errors import ConfigError

BETA_SCHEDULES: tuple[str, ...] = ("linear", "sqrt_linear", "sqrt")
"""Beta schedules accepted by :func:`discrete_eps` (names as in ComfyUI's ``make_beta_schedule``)."""

FLUX_DEFAULT_SHIFT = 1.15
"""Flux shift (mu) ComfyUI uses when no ModelSamplingFlux node sets one (equals the 1024x1024 value)."""


def _reshape_sigma(sigma: torch.Tensor, ndim: int) -> torch.Tensor:
    """A single sigma becomes a scalar; one sigma per batch item broadcasts over the other dims."""
    if sigma.nelement() == 1:
        return sigma.view(())
    return sigma.view(sigma.shape[:1] + (1,) * (ndim - 1))


def _as_tensor(sigma: torch.Tensor | float) -> torch.Tensor:
    return sigma if isinstance(sigma, torch.Tensor) else torch.tensor(float(sigma))


class ModelSampling(ABC):
    """Noise parametrisation of a model: sigma table, timestep mapping, input and output scaling."""

    sigmas: torch.Tensor
    """Increasing float32 table of the model's training noise levels (schedulers sample from it)."""

    is_flow: bool = False
    """True for rectified-flow models (ComfyUI's CONST): x_sigma = (1 - sigma) * x0 + sigma * noise."""

    @property
    def sigma_min(self) -> torch.Tensor:
        """Smallest table sigma (0-dim tensor)."""
        return self.sigmas[0]

    @property
    def sigma_max(self) -> torch.Tensor:
        """Largest table sigma (0-dim tensor)."""
        return self.sigmas[-1]

    @abstractmethod
    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """The timestep the network is conditioned on at noise level ``sigma``."""

    @abstractmethod
    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        """The noise level of ``timestep`` (inverse of :meth:`timestep`)."""

    @abstractmethod
    def percent_to_sigma(self, percent: float) -> float:
        """Noise level at ``percent`` (0 = start, 1 = end) of the sampling process."""

    @abstractmethod
    def calculate_input(self, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Scale the noisy latent into what the network takes as input."""

    def calculate_denoised(
        self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor
    ) -> torch.Tensor:
        """The denoised prediction (x0) from the network output and the (unscaled) noisy latent:
        ``x - output * sigma`` for both epsilon (output = eps) and flow (output = v) prediction."""
        sigma = _reshape_sigma(sigma, model_output.ndim)
        return model_input - model_output * sigma

    @abstractmethod
    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        """Noise ``latent_image`` to level ``sigma`` with unit-variance ``noise``."""

    @abstractmethod
    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """Undo the latent scaling of :meth:`noise_scaling` at the final sigma."""


class DiscreteEpsSampling(ModelSampling):
    """Epsilon prediction over a discrete DDPM beta schedule (ComfyUI ModelSamplingDiscrete + EPS)."""

    sigma_data = 1.0

    def __init__(self, beta_schedule: str, linear_start: float, linear_end: float, timesteps: int):
        betas = _make_betas(beta_schedule, timesteps, linear_start, linear_end)
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5
        self.beta_schedule, self.linear_start, self.linear_end = beta_schedule, linear_start, linear_end
        self.num_timesteps = timesteps
        self.sigmas = sigmas.float()
        self.log_sigmas = sigmas.log().float()

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        """Index of the table sigma nearest in log space (an integer tensor shaped like ``sigma``)."""
        log_sigma = sigma.log()
        dists = log_sigma.to(self.log_sigmas.device) - self.log_sigmas[:, None]
        return dists.abs().argmin(dim=0).view(sigma.shape).to(sigma.device)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        """Log-linear interpolation of the table at a (possibly fractional) timestep."""
        t = torch.clamp(timestep.float().to(self.log_sigmas.device), min=0, max=(len(self.sigmas) - 1))
        low_idx, high_idx, w = t.floor().long(), t.ceil().long(), t.frac()
        log_sigma = (1 - w) * self.log_sigmas[low_idx] + w * self.log_sigmas[high_idx]
        return log_sigma.exp().to(timestep.device)

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 999999999.9
        if percent >= 1.0:
            return 0.0
        return self.sigma(torch.tensor((1.0 - percent) * 999.0)).item()

    def calculate_input(self, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """``x / sqrt(sigma^2 + 1)``."""
        sigma = _reshape_sigma(sigma, noise.ndim)
        return noise / (sigma**2 + self.sigma_data**2) ** 0.5

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        """``latent + noise * sigma`` (``* sqrt(1 + sigma^2)`` when starting from the maximum sigma)."""
        sigma = _reshape_sigma(_as_tensor(sigma), noise.ndim)
        scaled = noise * torch.sqrt(1.0 + sigma**2.0) if max_denoise else noise * sigma
        return scaled + latent_image

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return latent


class _FlowPrediction(ModelSampling):
    """Velocity prediction of rectified flow (ComfyUI's CONST)."""

    is_flow = True

    def calculate_input(self, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return noise

    def noise_scaling(
        self, sigma: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor, max_denoise: bool = False
    ) -> torch.Tensor:
        """``sigma * noise + (1 - sigma) * latent``."""
        sigma = _reshape_sigma(_as_tensor(sigma), noise.ndim)
        return sigma * noise + (1.0 - sigma) * latent_image

    def inverse_noise_scaling(self, sigma: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """``latent / (1 - sigma)``."""
        sigma = _reshape_sigma(_as_tensor(sigma), latent.ndim)
        return latent / (1.0 - sigma)


def _time_snr_shift(alpha: float, t: torch.Tensor | float) -> torch.Tensor | float:
    if alpha == 1.0:
        return t
    return alpha * t / (1 + (alpha - 1) * t)


class DiscreteFlowSampling(_FlowPrediction):
    """SD3-style flow: ``sigma = shift*t / (1 + (shift-1)*t)`` with ``t = timestep / multiplier``."""

    def __init__(self, shift: float, multiplier: float, timesteps: int = 1000):
        self.shift, self.multiplier = shift, multiplier
        self.sigmas = self.sigma((torch.arange(1, timesteps + 1, 1) / timesteps) * multiplier)

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma * self.multiplier

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return _time_snr_shift(self.shift, timestep / self.multiplier)

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return _time_snr_shift(self.shift, 1.0 - percent)


def _flux_time_shift(mu: float, t: torch.Tensor | float) -> torch.Tensor | float:
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** 1.0)


class FluxFlowSampling(_FlowPrediction):
    """Flux flow: ``sigma = e^mu / (e^mu + 1/t - 1)``, timestep = sigma (``shift`` is mu)."""

    def __init__(self, shift: float = FLUX_DEFAULT_SHIFT, timesteps: int = 10000):
        self.shift = shift
        self.sigmas = self.sigma(torch.arange(1, timesteps + 1, 1) / timesteps)

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        return sigma

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        return _flux_time_shift(self.shift, timestep)

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return _flux_time_shift(self.shift, 1.0 - percent)


def _make_betas(schedule: str, n: int, linear_start: float, linear_end: float) -> torch.Tensor:
    if schedule == "linear":
        return torch.linspace(linear_start**0.5, linear_end**0.5, n, dtype=torch.float64) ** 2
    if schedule == "sqrt_linear":
        return torch.linspace(linear_start, linear_end, n, dtype=torch.float64)
    if schedule == "sqrt":
        return torch.linspace(linear_start, linear_end, n, dtype=torch.float64) ** 0.5
    raise ConfigError(
        f"unknown beta schedule {schedule!r}",
        "the discrete model sampling builds its sigma table from a named DDPM beta schedule",
        f"use one of {', '.join(BETA_SCHEDULES)} (PixArt uses 'sqrt_linear')",
    )


def _check_positive(name: str, value: float, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{name} is {value!r}", why, f"pass a finite number greater than 0 as {name}")


def discrete_eps(
    beta_schedule: str = "sqrt_linear", linear_start: float = 0.0001, linear_end: float = 0.02, timesteps: int = 1000
) -> DiscreteEpsSampling:
    """Discrete epsilon-prediction sampling; defaults are PixArt's (ComfyUI supported_models.PixArtAlpha)."""
    _check_positive("linear_start", linear_start, "betas must be positive noise variances")
    _check_positive("linear_end", linear_end, "betas must be positive noise variances")
    if isinstance(timesteps, bool) or not isinstance(timesteps, int) or timesteps < 2:
        raise ConfigError(
            f"timesteps is {timesteps!r}",
            "the sigma table needs at least two training timesteps",
            "pass an integer >= 2 (PixArt and SD use 1000)",
        )
    return DiscreteEpsSampling(beta_schedule, linear_start, linear_end, timesteps)


def flow_sd3(shift: float = 3.0, multiplier: float = 1000) -> DiscreteFlowSampling:
    """SD3 flow sampling (timestep = sigma * multiplier); shift 3.0 is SD3's default in ComfyUI.

    Other ComfyUI FLOW models are other settings, e.g. Flux schnell is ``flow_sd3(1.0, 1.0)``.
    """
    _check_positive("shift", shift, "the flow time shift divides the timestep axis and must be positive")
    _check_positive("multiplier", multiplier, "the multiplier maps sigma in [0, 1] to the model's timestep range")
    return DiscreteFlowSampling(shift, multiplier)


def flux_shift(width: int, height: int, base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """Flux mu for an image of ``width`` x ``height`` PIXELS, as ComfyUI's ModelSamplingFlux node computes it.

    Linear in the number of 2x2-patchified latent tokens (``width*height / 256``): ``base_shift`` at
    256 tokens, ``max_shift`` at 4096 tokens (1024x1024), extrapolated beyond.
    """
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{name} is {value!r}",
                "the Flux shift is computed from the image size in pixels",
                f"pass the image {name} in pixels as a positive integer (latent size x 8)",
            )
    x1, x2 = 256, 4096
    mm = (max_shift - base_shift) / (x2 - x1)
    b = base_shift - mm * x1
    return (width * height / (8 * 8 * 2 * 2)) * mm + b


def flow_flux(
    width: int | None = None, height: int | None = None, base_shift: float = 0.5, max_shift: float = 1.15
) -> FluxFlowSampling:
    """Flux flow sampling for an image of ``width`` x ``height`` PIXELS (see :func:`flux_shift`).

    Without a size it uses ComfyUI's model default shift 1.15 (what a graph without a ModelSamplingFlux
    node gets, whatever the resolution).
    """
    if width is None and height is None:
        return FluxFlowSampling(FLUX_DEFAULT_SHIFT)
    if width is None or height is None:
        raise ConfigError(
            f"flow_flux got width={width!r}, height={height!r}",
            "the resolution-dependent shift needs both sides of the image",
            "pass both width and height in pixels, or neither for the default shift 1.15",
        )
    return FluxFlowSampling(flux_shift(width, height, base_shift, max_shift))


def is_max_denoise(model_sampling: ModelSampling, sigmas: torch.Tensor) -> bool:
    """Whether sampling starts at (or above) the model's maximum sigma, as ComfyUI's Sampler.max_denoise."""
    max_sigma = float(model_sampling.sigma_max)
    sigma = float(sigmas[0])
    return math.isclose(max_sigma, sigma, rel_tol=1e-05) or sigma > max_sigma


def noise_latent(
    model_sampling: ModelSampling, sigmas: torch.Tensor, noise: torch.Tensor, latent_image: torch.Tensor
) -> torch.Tensor:
    """The sampler's starting latent: ``latent_image`` noised to ``sigmas[0]`` (ComfyUI KSAMPLER.sample)."""
    return model_sampling.noise_scaling(sigmas[0], noise, latent_image, is_max_denoise(model_sampling, sigmas))
