"""Wan 2.2 A14B's two experts from two single files (ComfyUI keeps them as ``..._high_noise_...`` and
``..._low_noise_...`` in ``models/diffusion_models``), held together as one two-expert model: the same
``PipelineComponents`` a diffusers A14B folder gives (``transformer_2`` and ``boundary_ratio``), so one pool
keeps both warm and sampling switches at the boundary (``denoise.loop.Experts``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import ConfigError
from .families.registry import family as family_of
from .loading import PipelineComponents


def check_boundary(boundary: float) -> float:
    """``boundary`` as a float, a ConfigError unless 0 < boundary < 1."""
    if not 0.0 < float(boundary) < 1.0:
        raise ConfigError(
            f"expert boundary {boundary!r}",
            "the high-noise expert denoises while sigma >= the boundary, the low-noise one below it (0 < b < 1)",
            "use a value between 0 and 1, e.g. 0.875 (Wan 2.2 A14B text-to-video) or 0.9 (image-to-video)",
        )
    return float(boundary)


def check_expert_pair(family: str, config: dict, path_2: str | os.PathLike, family_2: str, config_2: dict) -> None:
    """Both files must be transformers of one shape of a family with such pairs (Wan 2.2 A14B's experts)."""
    if family_of(family).expert_boundary is None or family_2 != family:
        raise ConfigError(
            f"a second expert file with a {family} model ({Path(path_2).name} is {family_2})",
            "two experts switched by noise level are Wan 2.2 A14B's (high noise, then low noise)",
            "load a Wan 2.2 A14B high-noise file as the model and its low-noise file as the second expert",
        )
    keys = sorted({*config, *config_2} - {"_class_name", "_diffusers_version"})
    differ = [k for k in keys if config.get(k) != config_2.get(k)]
    if differ:
        raise ConfigError(
            f"the second expert {Path(path_2).name} differs from the model in {', '.join(differ)}",
            "the two experts of one Wan 2.2 A14B model have the same shape and take the same inputs",
            "pick the low-noise file of the same model (e.g. both _t2v_ or both _i2v_, one precision)",
        )


def attach_second_expert(
    comps: PipelineComponents,
    path_2: str | os.PathLike,
    device: str | torch.device,
    dtype: torch.dtype,
    boundary: float | None = None,
    storage: str = "auto",
    dequant_dtype: str = "default",
) -> PipelineComponents:
    """``comps`` (a single file's high-noise expert) with the low-noise expert of ``path_2`` and the boundary."""
    from .single_file import load_single_file_components

    second = load_single_file_components(path_2, device, dtype, storage=storage, dequant_dtype=dequant_dtype)
    check_expert_pair(comps.family, comps.transformer_config, path_2, second.family, second.transformer_config)
    comps.transformer_2 = second.transformer
    default = family_of(comps.family).expert_boundary
    assert default is not None  # check_expert_pair
    comps.boundary_ratio = check_boundary(default(comps.transformer_config) if boundary is None else boundary)
    return comps
