"""k-diffusion samplers (ComfyUI names and math) written as generators, with the model evaluated outside.

``sampler_steps`` returns a generator that yields a :class:`ModelCall` for every model evaluation,
receives the denoised prediction (x0) through ``.send()`` and returns the final latent. Each patch of a
split latent can run its own generator (with a :class:`~.noise.SharedNoise` view as its noise). The
results equal ComfyUI's k-diffusion samplers (stored reference values in tests/data), including the
rectified-flow (CONST) branches of euler_ancestral and dpmpp_2m_sde and lcm's use of the model's
noise scaling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping
from types import MappingProxyType

import torch

from ..errors import ConfigError
from .model_sampling import ModelSampling
from .noise import BrownianTreeNoise, GeneratorNoise, NoiseSampler

SamplerGen = Generator["ModelCall", torch.Tensor, torch.Tensor]
DenoiseFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
StepCallback = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One model evaluation a sampler asks for: denoise ``x`` at noise level ``sigma``."""

    x: torch.Tensor
    """The noisy latent (or patch) to denoise; not scaled by ``calculate_input``."""
    sigma: torch.Tensor
    """0-dim float tensor: the noise level of ``x``."""
    step: int
    """Index of the sampling step (into sigmas) this evaluation belongs to."""
    stage: int = 0
    """0 for the first evaluation of a step, 1 for the second one of heun / dpm_2."""


@dataclasses.dataclass(frozen=True)
class _Options:
    model_sampling: ModelSampling
    noise: NoiseSampler | None
    eta: float
    s_noise: float


def _evaluate(x: torch.Tensor, sigma: torch.Tensor, step: int, stage: int = 0) -> SamplerGen:
    denoised = yield ModelCall(x, sigma, step, stage)
    if not isinstance(denoised, torch.Tensor) or denoised.shape != x.shape:
        got = f"shape {list(denoised.shape)}" if isinstance(denoised, torch.Tensor) else repr(denoised)
        raise ConfigError(
            f"sampler received {got} as the denoised prediction for an x of shape {list(x.shape)}",
            "each ModelCall must be answered with the model's x0 prediction for exactly that x",
            "drive the generator with gen.send(denoised) (not next()), denoised shaped like call.x",
        )
    return denoised


def _noise(opts: _Options, sigma: torch.Tensor, sigma_next: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    assert opts.noise is not None  # checked in sampler_steps
    noise = opts.noise(sigma, sigma_next)
    if noise.shape != like.shape:
        raise ConfigError(
            f"noise sampler returned shape {list(noise.shape)} for a latent of shape {list(like.shape)}",
            "stochastic samplers add noise shaped exactly like the latent (or patch) they update",
            "give each patch the SharedNoise.view() of its own region",
        )
    return noise.to(device=like.device, dtype=like.dtype)


def _to_d(x: torch.Tensor, sigma: torch.Tensor, denoised: torch.Tensor) -> torch.Tensor:
    return (x - denoised) / sigma


def _euler(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    for i in range(len(sigmas) - 1):
        denoised = yield from _evaluate(x, sigmas[i], i)
        d = _to_d(x, sigmas[i], denoised)
        x = x + d * (sigmas[i + 1] - sigmas[i])
    return x


def _ancestral_step(
    sigma_from: torch.Tensor, sigma_to: torch.Tensor, eta: float
) -> tuple[torch.Tensor, torch.Tensor | float]:
    """(sigma_down, sigma_up): deterministic step target and the noise added on top (k-diffusion)."""
    if not eta:
        return sigma_to, 0.0
    sigma_up = min(sigma_to, eta * (sigma_to**2 * (sigma_from**2 - sigma_to**2) / sigma_from**2) ** 0.5)
    sigma_down = (sigma_to**2 - sigma_up**2) ** 0.5
    return sigma_down, sigma_up


def _euler_ancestral(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    if opts.model_sampling.is_flow:
        return (yield from _euler_ancestral_flow(x, sigmas, opts))
    for i in range(len(sigmas) - 1):
        denoised = yield from _evaluate(x, sigmas[i], i)
        sigma_down, sigma_up = _ancestral_step(sigmas[i], sigmas[i + 1], opts.eta)
        if sigma_down == 0:
            x = denoised
        else:
            d = _to_d(x, sigmas[i], denoised)
            noise = _noise(opts, sigmas[i], sigmas[i + 1], x)
            x = x + d * (sigma_down - sigmas[i]) + noise * opts.s_noise * sigma_up
    return x


def _euler_ancestral_flow(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    eta = opts.eta
    for i in range(len(sigmas) - 1):
        denoised = yield from _evaluate(x, sigmas[i], i)
        if sigmas[i + 1] == 0:
            x = denoised
            continue
        sigma_down = sigmas[i + 1] * (1 + (sigmas[i + 1] / sigmas[i] - 1) * eta)
        alpha_next, alpha_down = 1 - sigmas[i + 1], 1 - sigma_down
        renoise = (sigmas[i + 1] ** 2 - sigma_down**2 * alpha_next**2 / alpha_down**2) ** 0.5
        ratio = sigma_down / sigmas[i]
        x = ratio * x + (1 - ratio) * denoised
        if eta > 0:
            x = (alpha_next / alpha_down) * x + _noise(opts, sigmas[i], sigmas[i + 1], x) * opts.s_noise * renoise
    return x


def _heun(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    for i in range(len(sigmas) - 1):
        denoised = yield from _evaluate(x, sigmas[i], i)
        d = _to_d(x, sigmas[i], denoised)
        dt = sigmas[i + 1] - sigmas[i]
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            denoised_2 = yield from _evaluate(x_2, sigmas[i + 1], i, 1)
            d_2 = _to_d(x_2, sigmas[i + 1], denoised_2)
            x = x + (d + d_2) / 2 * dt
    return x


def _dpm_2(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    for i in range(len(sigmas) - 1):
        denoised = yield from _evaluate(x, sigmas[i], i)
        d = _to_d(x, sigmas[i], denoised)
        if sigmas[i + 1] == 0:
            x = x + d * (sigmas[i + 1] - sigmas[i])
        else:
            sigma_mid = sigmas[i].log().lerp(sigmas[i + 1].log(), 0.5).exp()
            x_2 = x + d * (sigma_mid - sigmas[i])
            denoised_2 = yield from _evaluate(x_2, sigma_mid, i, 1)
            x = x + _to_d(x_2, sigma_mid, denoised_2) * (sigmas[i + 1] - sigmas[i])
    return x


def _dpmpp_2m(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    old_denoised = None
    for i in range(len(sigmas) - 1):
        denoised = yield from _evaluate(x, sigmas[i], i)
        t, t_next = sigmas[i].log().neg(), sigmas[i + 1].log().neg()
        h = t_next - t
        scale = t_next.neg().exp() / t.neg().exp()
        if old_denoised is None or sigmas[i + 1] == 0:
            x = scale * x - (-h).expm1() * denoised
        else:
            r = (t - sigmas[i - 1].log().neg()) / h
            denoised_d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old_denoised
            x = scale * x - (-h).expm1() * denoised_d
        old_denoised = denoised
    return x


def _half_log_snr(sigma: torch.Tensor, model_sampling: ModelSampling) -> torch.Tensor:
    """lambda = log(alpha / sigma): ``-log(sigma)`` (alpha = 1), or ``-logit(sigma)`` for flow models
    (alpha = 1 - sigma)."""
    return sigma.logit().neg() if model_sampling.is_flow else sigma.log().neg()


def _dpmpp_2m_sde(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    """DPM-Solver++(2M) SDE (Lu et al.), data-prediction form, midpoint correction.

    With the model's clean-image prediction D and lambda = log(alpha / sigma), the exact solution
    of the SDE over one step of length h = lambda_next - lambda, D held constant, is

        x_next = (sigma_next / sigma) e^(-eta h) x + alpha_next (1 - e^(-(1 + eta) h)) D
                 + sigma_next sqrt(1 - e^(-2 eta h)) z,   z ~ N(0, I)

    (eta = 0 gives the deterministic DPM-Solver++ step). The second order comes from the previous
    step: D is extrapolated to the middle of the step, D + (h / (2 h_prev)) (D - D_prev)."""
    ms, eta, s_noise = opts.model_sampling, opts.eta, opts.s_noise
    if ms.is_flow and len(sigmas) > 1 and sigmas[0] >= 1:
        # lambda(1) is -inf for a flow model (alpha = 0): start just below 1, as ComfyUI does
        sigmas = sigmas.clone()
        sigmas[0] = ms.percent_to_sigma(1e-4)
    previous: tuple[torch.Tensor, torch.Tensor] | None = None  # (D, h) of the last step
    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i], sigmas[i + 1]
        denoised = yield from _evaluate(x, sigma, i)
        if sigma_next == 0:  # the last step lands on the prediction itself
            x = denoised
            continue
        lam, lam_next = _half_log_snr(sigma, ms), _half_log_snr(sigma_next, ms)
        h = lam_next - lam
        alpha_next = sigma_next * lam_next.exp()
        target = denoised
        if previous is not None:
            denoised_prev, h_prev = previous
            target = denoised + (h / (2 * h_prev)) * (denoised - denoised_prev)
        keep = (sigma_next / sigma) * torch.exp(-eta * h)
        x = keep * x - alpha_next * torch.expm1(-(1 + eta) * h) * target
        if eta > 0 and s_noise > 0:
            spread = sigma_next * torch.sqrt(-torch.expm1(-2 * eta * h))
            x = x + _noise(opts, sigma, sigma_next, x) * spread * s_noise
        previous = (denoised, h)
    return x


def _lcm(x: torch.Tensor, sigmas: torch.Tensor, opts: _Options) -> SamplerGen:
    for i in range(len(sigmas) - 1):
        x = yield from _evaluate(x, sigmas[i], i)
        if sigmas[i + 1] > 0:
            noise = _noise(opts, sigmas[i], sigmas[i + 1], x)
            x = opts.model_sampling.noise_scaling(sigmas[i + 1], noise, x)
    return x


@dataclasses.dataclass(frozen=True)
class _Spec:
    run: Callable[[torch.Tensor, torch.Tensor, _Options], SamplerGen]
    noise: str | None = None
    """Default noise of the sampler in ComfyUI: 'generator', 'brownian' or None (deterministic)."""
    eta: float | None = None
    """Default eta; None if the sampler has no eta."""
    s_noise: float | None = None


SAMPLERS: Mapping[str, _Spec] = MappingProxyType(
    {
        "euler": _Spec(_euler),
        "euler_ancestral": _Spec(_euler_ancestral, "generator", 1.0, 1.0),
        "heun": _Spec(_heun),
        "dpm_2": _Spec(_dpm_2),
        "dpmpp_2m": _Spec(_dpmpp_2m),
        "dpmpp_2m_sde": _Spec(_dpmpp_2m_sde, "brownian", 1.0, 1.0),
        # ComfyUI's "ddim" is euler; its only difference (random inpaint noise) needs a denoise mask
        "ddim": _Spec(_euler),
        "lcm": _Spec(_lcm, "generator"),
    }
)
"""Sampler implementations by ComfyUI name."""

SAMPLER_NAMES: tuple[str, ...] = tuple(SAMPLERS)


def _spec(name: str) -> _Spec:
    spec = SAMPLERS.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown sampler {name!r}",
            "only samplers that reproduce ComfyUI's k-diffusion math are implemented",
            f"use one of: {', '.join(SAMPLER_NAMES)}",
        )
    return spec


def sampler_uses_noise(name: str) -> bool:
    """Whether the sampler adds fresh noise during sampling (and so needs a noise sampler)."""
    return _spec(name).noise is not None


def default_noise(
    name: str, shape: tuple[int, ...] | torch.Size, sigmas: torch.Tensor, seed: int
) -> NoiseSampler | None:
    """The full-latent noise sampler ComfyUI gives sampler ``name`` for ``seed`` (None if it needs none).

    Generator noise for euler_ancestral / lcm, a Brownian tree over the schedule for dpmpp_2m_sde
    (needs torchsde). Note: ComfyUI seeds it with the same seed as the initial noise; it draws on the
    CPU here (ComfyUI draws on the latent's device, so on a GPU its ancestral noise differs).
    """
    kind = _spec(name).noise
    if kind == "generator":
        return GeneratorNoise(shape, seed)
    if kind == "brownian":
        positive = sigmas[sigmas > 0]
        if len(sigmas) <= 1 or len(positive) == 0:
            return GeneratorNoise(shape, seed)  # nothing to sample: never called
        return BrownianTreeNoise(shape, positive.min(), sigmas.max(), seed)
    return None


def _option(name: str, spec_default: float | None, value: float | None, option: str) -> float:
    if value is None:
        return 1.0 if spec_default is None else spec_default
    if spec_default is None:
        raise ConfigError(
            f"{option}={value!r} given for sampler {name!r}",
            f"{name} has no {option} parameter, so the value would be silently ignored",
            f"drop {option}, or use a sampler that has it (euler_ancestral, dpmpp_2m_sde)",
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(
            f"{option} is {value!r}", f"{option} scales the added noise", f"pass a number >= 0 as {option}"
        )
    return float(value)


def sampler_steps(
    name: str,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    noise: NoiseSampler | None = None,
    *,
    model_sampling: ModelSampling,
    eta: float | None = None,
    s_noise: float | None = None,
) -> SamplerGen:
    """Generator running sampler ``name`` from latent ``x`` (already noised to ``sigmas[0]``).

    Yields a :class:`ModelCall` per model evaluation, expects the denoised x0 back via ``.send()``
    and returns the final latent (StopIteration.value). ``noise`` is required by the stochastic samplers
    (see :func:`default_noise` and :class:`~.noise.SharedNoise`); ``eta`` / ``s_noise`` only exist for
    euler_ancestral and dpmpp_2m_sde (default 1.0). ``model_sampling`` selects ComfyUI's flow branches.
    ``ModelCall.sigma`` is where ComfyUI evaluates the model: for dpmpp_2m_sde on a flow model a first
    sigma of 1 becomes ``percent_to_sigma(1e-4)``.
    """
    spec = _spec(name)
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1:
        raise ConfigError(
            f"sigmas is {type(sigmas).__name__} with shape {getattr(sigmas, 'shape', None)}",
            "a sampler walks a 1-D tensor of decreasing noise levels",
            "pass a 1-D tensor, e.g. calculate_sigmas(model_sampling, 'normal', steps)",
        )
    if spec.noise is not None and noise is None:
        raise ConfigError(
            f"sampler {name!r} needs a noise sampler but got none",
            f"{name} adds fresh noise every step",
            "pass noise=default_noise(name, full_latent_shape, sigmas, seed), or a SharedNoise view per patch",
        )
    if not isinstance(model_sampling, ModelSampling):
        raise ConfigError(
            f"model_sampling is {type(model_sampling).__name__}",
            "samplers need the model's sampling object for the flow (CONST) branches and lcm's noise scaling",
            "pass discrete_eps(), flow_sd3() or flow_flux(...)",
        )
    opts = _Options(
        model_sampling, noise, _option(name, spec.eta, eta, "eta"), _option(name, spec.s_noise, s_noise, "s_noise")
    )
    return spec.run(x, sigmas, opts)


@torch.no_grad()
def sample(
    name: str,
    denoise_fn: DenoiseFn,
    x: torch.Tensor,
    sigmas: torch.Tensor,
    noise: NoiseSampler | None = None,
    *,
    model_sampling: ModelSampling,
    eta: float | None = None,
    s_noise: float | None = None,
    callback: StepCallback | None = None,
) -> torch.Tensor:
    """Run sampler ``name`` with ``denoise_fn(x, sigma) -> x0`` (under no_grad, as ComfyUI).

    ``callback(step, x, denoised)`` is called once per step, after its first model evaluation.
    """
    steps = sampler_steps(name, x, sigmas, noise, model_sampling=model_sampling, eta=eta, s_noise=s_noise)
    try:
        call = next(steps)
        while True:
            denoised = denoise_fn(call.x, call.sigma)
            if callback is not None and call.stage == 0:
                callback(call.step, call.x, denoised)
            call = steps.send(denoised)
    except StopIteration as done:
        return done.value
