"""What one PipeFusion generation is asked (its options) and what one rank saw doing it (its stats)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class PipeFusionSettings:
    """PipeFusion options of one generation."""

    patches: int | None = None  # row bands; None: default_patches(pp, token rows)
    warmup: int = 1  # first steps run synchronously on the whole image
    timeout_s: float = 600.0  # longest wait for one message from a neighbouring stage
    # Baselines for tests and benchmarks only (never better than the defaults):
    stale_kv: bool = True  # False: a patch attends only to its own fresh tokens (no K/V of the other patches)
    agree_cancel_every: Literal["step", "slot"] = "step"  # "slot": the former per-slot agreement (its cost)
    # reference-image tokens (edit models) run with each step's first patch, their K/V kept for the step's other
    # patches; "recomputed": with every patch; "kept": only in the whole-image (warmup) steps (see README)
    reference_kv: Literal["per_step", "kept", "recomputed"] = "per_step"

    def check(self, num_stages: int, pp: int) -> None:
        """The options against a stage plan of ``num_stages`` on a mesh of ``pp`` stages (what, why, fix)."""
        if num_stages != pp:
            raise ConfigError(
                f"a stage plan of {num_stages} stages on a mesh with pp={pp}",
                "each pp rank runs one stage",
                "plan the stages with the mesh's pp degree",
            )
        if pp < 2:
            raise ConfigError(
                "PipeFusion with pp=1",
                "a pipeline needs at least two stages; one stage is the ordinary engine",
                "use denoise.loop.denoise_latent, or a mesh with pp >= 2",
            )
        if self.agree_cancel_every not in ("step", "slot"):
            raise ConfigError(
                f"PipeFusion agree_cancel_every={self.agree_cancel_every!r}",
                "ranks agree on cancel once per step, or (to measure its cost) after every slot",
                "use 'step' (the default) or 'slot'",
            )


@dataclasses.dataclass
class PipeFusionStats:
    """What one rank saw (returned for benchmarks and tests)."""

    stage: int
    patches: int
    items: int
    slots: int
    bubble_fraction: float
    sent_bytes: dict[str, int]
    kv_buffer_bytes: int
    reference_tokens: int = 0  # reference-image tokens run through this stage's blocks, summed over blocks
    control_tokens: int = 0  # image tokens x batch rows run through this stage's ControlNet blocks, over blocks/links
    chain_tokens: int = 0  # image tokens x batch rows run through a whole ControlNet on stage 0, summed over links
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # compute / receive / agree / total
    agreements: int = 0  # cancel agreements joined (once per step, plus one before the first slot)
    cache: list[dict] = dataclasses.field(default_factory=list)  # what the block cache did (its summary)
