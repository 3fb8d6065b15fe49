"""ComfyUI's samplers by name: one table of what each one is and needs (docs/sampling.md §5), and the
generator API every layout drives.

``sampler_steps`` returns a generator that yields a :class:`~.protocol.ModelCall` for every model
evaluation, receives the prediction through ``.send()`` (a tensor, or :class:`~.protocol.Guided` with the
unconditional prediction for the CFG++ samplers) and returns the final latent. Each patch of a split
latent can run its own generator (with a :class:`~.noise.SharedNoise` view as its noise). Results equal
ComfyUI 0.3.64's (stored reference values in tests/data).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch

from ..errors import ConfigError
from .model_sampling import ModelSampling
from .noise import BrownianTreeNoise, GeneratorNoise, NoiseSampler
from .protocol import Guided, Run, SamplerGen, Solver
from .solvers import ancestral, dpm_solver, exponential, multistep, ode, sa_solver, sde, unipc

DenoiseFn = Callable[[torch.Tensor, torch.Tensor], "torch.Tensor | Guided"]
StepCallback = Callable[[int, torch.Tensor, torch.Tensor], None]

NOISY = MappingProxyType({"eta": 1.0, "s_noise": 1.0})
S_NOISE = MappingProxyType({"s_noise": 1.0})


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """One ComfyUI sampler: its solver and what it needs from the caller."""

    solver: Solver
    order: int
    """Order of accuracy of its deterministic part (for the docs; lcm and ddpm count as 1)."""
    calls: int
    """Most model evaluations in one step (dpm_adaptive: in one try; how many tries depends on the latent)."""
    noise: str | None = None
    """ComfyUI's default noise sampler: 'generator', 'brownian', or None (deterministic)."""
    options: Mapping[str, float] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """The noise options (eta, s_noise) it takes, with ComfyUI's defaults."""
    cfg_pp: bool = False
    """Needs the unconditional prediction (CFG++)."""
    drops_penultimate: bool = False
    """ComfyUI's KSampler schedules one step more and drops the second-to-last sigma."""
    per_patch: bool = True
    """Gives the whole latent's result when run patch by patch (PipeFusion)."""
    last_sigma: float | None = None
    """The sigma a final 0 becomes for the inverse noise scaling (uni_pc)."""
    inpaint_seed_offset: int | None = None
    """ddim: the kept region of a noise mask is re-noised from a generator seeded seed + this."""


P = functools.partial
SAMPLERS: Mapping[str, SamplerSpec] = MappingProxyType(
    {
        "euler": SamplerSpec(ode.euler, 1, 1),
        "euler_cfg_pp": SamplerSpec(exponential.euler_cfg_pp, 1, 1, cfg_pp=True),
        "euler_ancestral": SamplerSpec(ancestral.euler_ancestral, 1, 1, noise="generator", options=NOISY),
        "euler_ancestral_cfg_pp": SamplerSpec(
            P(exponential.euler_cfg_pp, ancestral=True), 1, 1, noise="generator", options=NOISY, cfg_pp=True
        ),
        "heun": SamplerSpec(ode.heun, 2, 2),
        "heunpp2": SamplerSpec(ode.heunpp2, 3, 3),
        "dpm_2": SamplerSpec(ode.dpm_2, 2, 2, drops_penultimate=True),
        "dpm_2_ancestral": SamplerSpec(
            ancestral.dpm_2_ancestral, 2, 2, noise="generator", options=NOISY, drops_penultimate=True
        ),
        "lms": SamplerSpec(multistep.lms, 4, 1),
        "dpm_fast": SamplerSpec(dpm_solver.dpm_fast, 3, 3),
        "dpm_adaptive": SamplerSpec(dpm_solver.dpm_adaptive, 3, 3, per_patch=False),
        "dpmpp_2s_ancestral": SamplerSpec(ancestral.dpmpp_2s_ancestral, 2, 2, noise="generator", options=NOISY),
        "dpmpp_2s_ancestral_cfg_pp": SamplerSpec(
            exponential.dpmpp_2s_ancestral_cfg_pp, 2, 2, noise="generator", options=NOISY, cfg_pp=True
        ),
        "dpmpp_sde": SamplerSpec(sde.dpmpp_sde, 2, 2, noise="brownian", options=NOISY),
        "dpmpp_sde_gpu": SamplerSpec(sde.dpmpp_sde, 2, 2, noise="brownian", options=NOISY),
        "dpmpp_2m": SamplerSpec(exponential.dpmpp_2m, 2, 1),
        "dpmpp_2m_cfg_pp": SamplerSpec(exponential.dpmpp_2m_cfg_pp, 2, 1, cfg_pp=True),
        "dpmpp_2m_sde": SamplerSpec(sde.dpmpp_multistep_sde, 2, 1, noise="brownian", options=NOISY),
        "dpmpp_2m_sde_gpu": SamplerSpec(sde.dpmpp_multistep_sde, 2, 1, noise="brownian", options=NOISY),
        "dpmpp_2m_sde_heun": SamplerSpec(P(sde.dpmpp_multistep_sde, heun=True), 2, 1, noise="brownian", options=NOISY),
        "dpmpp_2m_sde_heun_gpu": SamplerSpec(
            P(sde.dpmpp_multistep_sde, heun=True), 2, 1, noise="brownian", options=NOISY
        ),
        "dpmpp_3m_sde": SamplerSpec(P(sde.dpmpp_multistep_sde, order=3), 3, 1, noise="brownian", options=NOISY),
        "dpmpp_3m_sde_gpu": SamplerSpec(P(sde.dpmpp_multistep_sde, order=3), 3, 1, noise="brownian", options=NOISY),
        "ddpm": SamplerSpec(ancestral.ddpm, 1, 1, noise="generator"),
        "lcm": SamplerSpec(ancestral.lcm, 1, 1, noise="generator"),
        "ipndm": SamplerSpec(multistep.ipndm, 4, 1),
        "ipndm_v": SamplerSpec(multistep.ipndm_v, 4, 1),
        "deis": SamplerSpec(multistep.deis, 3, 1),
        "res_multistep": SamplerSpec(exponential.res_multistep, 2, 1),
        "res_multistep_cfg_pp": SamplerSpec(P(exponential.res_multistep, cfg_pp=True), 2, 1, cfg_pp=True),
        "res_multistep_ancestral": SamplerSpec(
            P(exponential.res_multistep, ancestral=True), 2, 1, noise="generator", options=NOISY
        ),
        "res_multistep_ancestral_cfg_pp": SamplerSpec(
            P(exponential.res_multistep, ancestral=True, cfg_pp=True),
            2,
            1,
            noise="generator",
            options=NOISY,
            cfg_pp=True,
        ),
        "gradient_estimation": SamplerSpec(ode.gradient_estimation, 2, 1),
        "gradient_estimation_cfg_pp": SamplerSpec(P(ode.gradient_estimation, cfg_pp=True), 2, 1, cfg_pp=True),
        "er_sde": SamplerSpec(sde.er_sde, 3, 1, noise="generator", options=S_NOISE),
        "seeds_2": SamplerSpec(sde.seeds, 2, 2, noise="generator", options=NOISY),
        "seeds_3": SamplerSpec(P(sde.seeds, stages=3), 3, 3, noise="generator", options=NOISY),
        "sa_solver": SamplerSpec(sa_solver.sa_solver, 3, 1, noise="generator", options=S_NOISE),
        "sa_solver_pece": SamplerSpec(P(sa_solver.sa_solver, pece=True), 4, 2, noise="generator", options=S_NOISE),
        "ddim": SamplerSpec(ode.euler, 1, 1, inpaint_seed_offset=1),
        "uni_pc": SamplerSpec(unipc.unipc, 3, 1, drops_penultimate=True, last_sigma=unipc.UNIPC_LAST_SIGMA),
        "uni_pc_bh2": SamplerSpec(
            P(unipc.unipc, bh2=True), 3, 1, drops_penultimate=True, last_sigma=unipc.UNIPC_LAST_SIGMA
        ),
    }
)
"""Every sampler of ComfyUI 0.3.64 by name, in ComfyUI's order (KSAMPLER_NAMES, then ddim, uni_pc, uni_pc_bh2)."""

SAMPLER_NAMES: list[str] = list(SAMPLERS)
"""ComfyUI 0.3.64's ``SAMPLER_NAMES``, same order."""


def sampler_spec(name: str) -> SamplerSpec:
    """The table entry of sampler ``name`` (a clear error for an unknown name)."""
    spec = SAMPLERS.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown sampler {name!r}",
            "the samplers are ComfyUI's, by name",
            f"use one of: {', '.join(SAMPLER_NAMES)}",
        )
    return spec


def sampler_uses_noise(name: str) -> bool:
    """Whether the sampler adds fresh noise during sampling (and so needs a noise sampler)."""
    return sampler_spec(name).noise is not None


def sampler_needs_uncond(name: str) -> bool:
    """Whether the sampler needs the unconditional prediction (CFG++), even at cfg 1."""
    return sampler_spec(name).cfg_pp


def drops_penultimate_sigma(name: str) -> bool:
    """Whether ComfyUI's KSampler drops the second-to-last sigma of one extra step for this sampler."""
    return sampler_spec(name).drops_penultimate


def final_sigma(name: str, sigmas: torch.Tensor) -> torch.Tensor:
    """The sigma ComfyUI undoes the noise scaling at after sampler ``name`` ran over ``sigmas``."""
    last = sampler_spec(name).last_sigma
    if last is not None and sigmas[-1] == 0:
        return torch.tensor(last, dtype=sigmas.dtype)
    return sigmas[-1]


def default_noise(
    name: str, shape: tuple[int, ...] | torch.Size, sigmas: torch.Tensor, seed: int
) -> NoiseSampler | None:
    """The full-latent noise sampler ComfyUI gives sampler ``name`` for ``seed`` (None if it needs none).

    A generator seeded with the seed, or a Brownian tree over the schedule's [smallest positive, largest]
    sigma (needs torchsde; the _gpu samplers share it: on the CPU ComfyUI's trees are equal). ComfyUI
    draws generator noise on the latent's device, so on a GPU its draws differ from these CPU ones.
    """
    kind = sampler_spec(name).noise
    if kind == "generator":
        return GeneratorNoise(shape, seed)
    if kind == "brownian":
        positive = sigmas[sigmas > 0]
        if len(sigmas) <= 1 or len(positive) == 0:
            return GeneratorNoise(shape, seed)  # nothing to sample: never called
        return BrownianTreeNoise(shape, positive.min(), sigmas.max(), seed)
    return None


def _option(name: str, spec: SamplerSpec, option: str, value: float | None) -> float:
    default = spec.options.get(option)
    if value is None:
        return {"eta": 0.0, "s_noise": 1.0}[option] if default is None else default
    if default is None:
        takers = ", ".join(n for n, s in SAMPLERS.items() if option in s.options)
        raise ConfigError(
            f"{option}={value!r} given for sampler {name!r}",
            f"{name} has no {option} parameter, so the value would be silently ignored",
            f"drop {option}, or use a sampler that has it ({takers})",
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

    Yields a ModelCall per model evaluation, expects the prediction back via ``.send()`` (``Guided`` for
    the CFG++ samplers) and returns the final latent (StopIteration.value). ``noise`` is required by the
    stochastic samplers (see :func:`default_noise` and :class:`~.noise.SharedNoise`); ``eta`` /
    ``s_noise`` exist for the samplers whose table entry lists them (ComfyUI's defaults otherwise).
    ``ModelCall.sigma`` is where ComfyUI evaluates the model (e.g. a flow start moved off sigma 1).
    """
    spec = sampler_spec(name)
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1:
        raise ConfigError(
            f"sigmas is {type(sigmas).__name__} with shape {getattr(sigmas, 'shape', None)}",
            "a sampler walks a 1-D tensor of decreasing noise levels",
            "pass a 1-D tensor, e.g. calculate_sigmas(model_sampling, 'normal', steps)",
        )
    if spec.noise is not None and noise is None:
        raise ConfigError(
            f"sampler {name!r} needs a noise sampler but got none",
            f"{name} adds fresh noise during sampling",
            "pass noise=default_noise(name, full_latent_shape, sigmas, seed), or a SharedNoise view per patch",
        )
    if not isinstance(model_sampling, ModelSampling):
        raise ConfigError(
            f"model_sampling is {type(model_sampling).__name__}",
            "samplers need the model's sampling object (flow or not, percent_to_sigma, noise scaling)",
            "pass discrete_eps(), flow_sd3() or flow_flux(...)",
        )
    run = Run(model_sampling, noise, _option(name, spec, "eta", eta), _option(name, spec, "s_noise", s_noise))
    return spec.solver(x, sigmas.float(), run)


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
    """Run sampler ``name`` with ``denoise_fn(x, sigma)`` -> x0 (or Guided) under no_grad, as ComfyUI.

    ``callback(step, x, denoised)`` is called once per step, at its first model evaluation.
    """
    steps = sampler_steps(name, x, sigmas, noise, model_sampling=model_sampling, eta=eta, s_noise=s_noise)
    try:
        call = next(steps)
        while True:
            answer = denoise_fn(call.x, call.sigma)
            if callback is not None and call.stage == 0:
                callback(call.step, call.x, answer.denoised if isinstance(answer, Guided) else answer)
            call = steps.send(answer)
    except StopIteration as done:
        return done.value
