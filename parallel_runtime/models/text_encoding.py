"""Prompt -> Conditioning with a pipeline's own text encoders, matching diffusers' encode_prompt.

Each family states how its pipeline encodes prompts in its folder (``families/<family>/text.py``: which
encoders, how their outputs combine, how many tokens by default); this module finds the family's encoder
through the registry. Each encoder runs on the device its weights are on; results are moved to ``device``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import ConfigError
from .base import Conditioning
from .families.registry import family as family_spec
from .families.registry import family_ids, find_family
from .text_parts import TextComponents, component, device_of


def default_max_sequence_length(components: TextComponents, family: str) -> int:
    """Tokens the family's diffusers pipeline encodes a prompt to by default."""
    spec = family_spec(family)
    pick = spec.text_encoding().default_length
    return pick(components) if pick is not None else spec.text.max_length


@torch.no_grad()
def encode_prompt(
    components: TextComponents,
    family: str,
    prompt: str | Sequence[str],
    max_sequence_length: int | None = None,
    device: torch.device | str | None = None,
) -> Conditioning:
    """Encode ``prompt`` (one string or a batch) into the family's Conditioning.

    ``device`` defaults to the device of the first text encoder."""
    if find_family(family) is None:
        raise ConfigError(
            f"unknown model family {family!r} for text encoding",
            "each family combines its text encoders differently",
            f"use one of: {', '.join(family_ids())}",
        )
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not components.text_encoders:
        component(components, "encoder", "text_encoder", family)  # raises the 'not loaded' error
    if device is None:
        device = device_of(next(iter(components.text_encoders.values())))
    length = max_sequence_length or default_max_sequence_length(components, family)
    return family_spec(family).text_encoding().encode(components, prompts, length, torch.device(device))


def encode_prompts(
    components: TextComponents,
    family: str,
    prompt: str | Sequence[str],
    negative_prompt: str | Sequence[str] = "",
    max_sequence_length: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[Conditioning, Conditioning]:
    """(positive, negative) conditioning; a string negative is repeated for every prompt."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    negatives = [negative_prompt] * len(prompts) if isinstance(negative_prompt, str) else list(negative_prompt)
    if len(negatives) != len(prompts):
        raise ConfigError(
            f"{len(negatives)} negative prompts for {len(prompts)} prompts",
            "each prompt's negative forms its classifier-free-guidance pair",
            "pass one negative string, or a list as long as the prompt list",
        )
    pos = encode_prompt(components, family, prompts, max_sequence_length, device)
    neg = encode_prompt(components, family, negatives, max_sequence_length, device)
    return pos, neg
