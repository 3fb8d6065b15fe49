"""Which ComfyUI model sampling a model runs with, as plain data.

A family's adapter declares the default its model file implies (``ModelPlan.model_sampling``,
ComfyUI's ``supported_models`` ``sampling_settings`` and model type); a "Parallel Model Sampling
Flux / SD3 / AuraFlow" node replaces it for one PARALLEL_MODEL. ``denoise.model_sampling`` turns a
spec into the sampling math (``sampling.ModelSampling``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from ..errors import ConfigError

Kind = Literal["flux_flow", "discrete_flow", "discrete_eps"]
KINDS: tuple[str, ...] = ("flux_flow", "discrete_flow", "discrete_eps")


@dataclasses.dataclass(frozen=True)
class ModelSamplingSpec:
    """One of ComfyUI's model samplings with its parameters, and where they came from.

    - ``flux_flow``: ModelSamplingFlux + CONST (Flux dev): ``shift`` is mu, sigma = e^mu / (e^mu + 1/t - 1);
    - ``discrete_flow``: ModelSamplingDiscreteFlow + CONST (SD3, Flux schnell, AuraFlow):
      sigma = shift*t / (1 + (shift-1)*t), timestep = sigma * ``multiplier``;
    - ``discrete_eps``: ModelSamplingDiscrete + EPS over a DDPM beta schedule (PixArt).
    """

    kind: Kind
    shift: float = 1.0
    multiplier: float = 1000.0
    beta_schedule: str = "linear"
    linear_start: float = 0.00085
    linear_end: float = 0.012
    timesteps: int = 1000
    source: str = "the model file's default"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(
                f"unknown model sampling kind {self.kind!r}",
                "a model samples as Flux flow, discrete flow (SD3) or discrete epsilon (PixArt)",
                f"use one of {', '.join(KINDS)}",
            )
        for name in ("shift", "multiplier"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(
                    f"model sampling {name} is {value!r}",
                    "the model sampling's parameters are finite numbers",
                    f"pass a finite number as {name}",
                )
        if self.kind == "discrete_flow" and not (self.shift > 0 and self.multiplier > 0):
            raise ConfigError(
                f"discrete flow sampling with shift {self.shift} and multiplier {self.multiplier}",
                "SD3-style sampling divides by the shift and maps sigma to timesteps with the multiplier; "
                "with 0 every noise level collapses to 0",
                "use a shift greater than 0 (SD3: 3.0, AuraFlow: 1.73)",
            )

    def with_source(self, source: str) -> ModelSamplingSpec:
        return dataclasses.replace(self, source=source)

    def describe(self) -> str:
        """What a user sees on the sampler node, e.g. "Flux shift 1.15 (the model file's default)"."""
        if self.kind == "flux_flow":
            what = f"Flux shift {self.shift:.4g}"
        elif self.kind == "discrete_flow":
            what = f"discrete flow shift {self.shift:.4g}, multiplier {self.multiplier:.4g}"
        else:
            what = f"discrete eps ({self.beta_schedule} betas {self.linear_start:g}..{self.linear_end:g})"
        return f"{what} ({self.source})"


def flux_sampling(shift: float = 1.15, source: str = "the model file's default") -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingFlux: Flux dev files get shift 1.15."""
    return ModelSamplingSpec("flux_flow", shift=float(shift), source=source)


def discrete_flow_sampling(
    shift: float, multiplier: float = 1000.0, source: str = "the model file's default"
) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingDiscreteFlow: SD3 files get shift 3.0 (multiplier 1000), Flux schnell 1.0 / 1.0."""
    return ModelSamplingSpec("discrete_flow", shift=float(shift), multiplier=float(multiplier), source=source)


def discrete_eps_sampling(
    beta_schedule: str = "linear",
    linear_start: float = 0.00085,
    linear_end: float = 0.012,
    timesteps: int = 1000,
    source: str = "the model file's default",
) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingDiscrete (EPS): PixArt files get sqrt_linear 0.0001..0.02 over 1000 steps."""
    return ModelSamplingSpec(
        "discrete_eps",
        beta_schedule=beta_schedule,
        linear_start=float(linear_start),
        linear_end=float(linear_end),
        timesteps=int(timesteps),
        source=source,
    )
