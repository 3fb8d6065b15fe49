"""How a sampler talks to the model: a generator that yields a :class:`ModelCall` per evaluation and
receives the prediction through ``.send()`` (the model runs outside, on any layout).

A sampler written against this protocol is a function ``(x, sigmas, run) -> SamplerGen``; its return
value (``StopIteration.value``) is the final latent. ``run`` carries the options every sampler may
read: the model sampling (flow or not, ``percent_to_sigma``, ``noise_scaling``), the noise sampler and
η / s_noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .model_sampling import ModelSampling
from .noise import NoiseSampler


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One model evaluation a sampler asks for: denoise ``x`` at noise level ``sigma``."""

    x: torch.Tensor
    """The noisy latent (or patch) to denoise; not scaled by ``calculate_input``."""
    sigma: torch.Tensor
    """0-dim float tensor: the noise level of ``x``."""
    step: int
    """Index of the sampling step this evaluation belongs to."""
    stage: int = 0
    """0 for the first evaluation of a step, 1, 2, ... for the later ones (heun, seeds_3, dpm_fast, ...)."""


class Guided(NamedTuple):
    """A model evaluation's answer with the unconditional prediction too (CFG++ samplers need it)."""

    denoised: torch.Tensor
    """The guided prediction of the clean latent (what every sampler steps with)."""
    uncond: torch.Tensor
    """The unconditional (negative) prediction that went into it (0 when there is no negative)."""


Answer = torch.Tensor | Guided
SamplerGen = Generator[ModelCall, Answer, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Run:
    """What a sampler reads besides the latent and the schedule."""

    model_sampling: ModelSampling
    noise: NoiseSampler | None
    eta: float
    s_noise: float

    def draw(self, sigma: torch.Tensor, sigma_next: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The noise sampler's unit-normal draw for the interval ``sigma -> sigma_next``, shaped like ``like``."""
        if self.noise is None:
            raise ConfigError(
                "a stochastic sampler ran without a noise sampler",
                "it adds fresh noise during sampling",
                "pass noise=default_noise(name, shape, sigmas, seed), or a SharedNoise view per patch",
            )
        z = self.noise(sigma, sigma_next)
        if z.shape != like.shape:
            raise ConfigError(
                f"noise sampler returned shape {list(z.shape)} for a latent of shape {list(like.shape)}",
                "stochastic samplers add noise shaped exactly like the latent (or patch) they update",
                "give each patch the SharedNoise.view() of its own region",
            )
        return z.to(device=like.device, dtype=like.dtype)


def _checked(answer: object, x: torch.Tensor) -> Answer:
    denoised = answer.denoised if isinstance(answer, Guided) else answer
    if not isinstance(denoised, torch.Tensor) or denoised.shape != x.shape:
        got = f"shape {list(denoised.shape)}" if isinstance(denoised, torch.Tensor) else repr(answer)
        raise ConfigError(
            f"sampler received {got} as the denoised prediction for an x of shape {list(x.shape)}",
            "each ModelCall must be answered with the model's x0 prediction for exactly that x",
            "drive the generator with gen.send(denoised) (not next()), denoised shaped like call.x",
        )
    return answer  # type: ignore[return-value]


def ask(x: torch.Tensor, sigma: torch.Tensor, step: int, stage: int = 0) -> Generator[ModelCall, Answer, torch.Tensor]:
    """``D(x, sigma)``: yield one model call and return the guided prediction."""
    answer = _checked((yield ModelCall(x, sigma, step, stage)), x)
    return answer.denoised if isinstance(answer, Guided) else answer


def ask_guided(x: torch.Tensor, sigma: torch.Tensor, step: int, stage: int = 0) -> Generator[ModelCall, Answer, Guided]:
    """``(D, U)`` at ``(x, sigma)``: the guided and the unconditional prediction (CFG++)."""
    answer = _checked((yield ModelCall(x, sigma, step, stage)), x)
    if not isinstance(answer, Guided):
        raise ConfigError(
            "a CFG++ sampler was answered with the guided prediction only",
            "CFG++ re-noises with the unconditional prediction, so it needs both",
            "answer its ModelCalls with Guided(denoised, uncond) (Denoiser(..., with_uncond=True))",
        )
    return answer


Solver = Callable[[torch.Tensor, torch.Tensor, Run], SamplerGen]
"""A sampler: ``solver(x, sigmas, run)`` -> generator."""
