"""Reading a single file's tensor shapes: the helpers the families' original-layout modules share.

Each family folder's ``keys.py`` reads from its own tensor names what the weights decide about a diffusers
config (depth, width, heads where the weights show them, channels, optional parts); these are the common
steps: a tensor's shape with a clear error when it is missing, block counts and head counts.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import ConfigError

Shapes = Mapping[str, tuple[int, ...]]
StateDict = dict[str, torch.Tensor]


def shape_of(shapes: Shapes, key: str, family: str) -> tuple[int, ...]:
    """The shape of tensor ``key`` of a ``family`` file; a clear error when the file lacks it."""
    if key not in shapes:
        raise ConfigError(
            f"the {family} file has no tensor {key!r}",
            f"every {family} transformer in its original layout has it; the file is incomplete or another model",
            "use the complete transformer file as published (or a diffusers folder)",
        )
    return tuple(shapes[key])


def block_count(shapes: Shapes, prefix: str) -> int:
    """Number of blocks ``prefix<N>.`` (highest index + 1)."""
    indices = {k[len(prefix) :].split(".", 1)[0] for k in shapes if k.startswith(prefix)}
    numbers = [int(i) for i in indices if i.isdigit()]
    return max(numbers) + 1 if numbers else 0


def blocks_with(shapes: Shapes, prefix: str, part: str) -> tuple[int, ...]:
    """Indices of the blocks ``prefix<N>.`` that hold a tensor starting with ``part``."""
    found = set()
    for key in shapes:
        if key.startswith(prefix):
            index, _, rest = key[len(prefix) :].partition(".")
            if index.isdigit() and rest.startswith(part):
                found.add(int(index))
    return tuple(sorted(found))


def heads_of(hidden: int, head_dim: int, family: str) -> int:
    """Attention heads of weights ``hidden`` wide with heads ``head_dim`` wide; a clear error when they do not divide."""
    if head_dim <= 0 or hidden % head_dim:
        raise ConfigError(
            f"the {family} weights are {hidden} wide, which does not split into heads of {head_dim}",
            "the weights do not store the head count of this family; it follows from the head width",
            "pass overrides={'attention_head_dim': <head width>} (e.g. 64 or 72) for this file",
        )
    return hidden // head_dim


def scaled_rope_axes(head_dim: int) -> tuple[int, int, int]:
    """A 3-axis rotary split of a head over (index, row, column): FLUX.1's (16, 56, 56) for 128, scaled the
    same way for other head widths (each part even)."""
    side = (head_dim * 7 // 16) // 2 * 2
    return (head_dim - 2 * side, side, side)


# -- a layout computed from a diffusers config (LoRA files name the original layout's tensors) ---------------
TIMESTEP_FEATURES = 256  # the sinusoidal timestep width every family's embedders take


def add_linear(out: dict[str, tuple[int, ...]], name: str, rows: int, cols: int, bias: bool = True) -> None:
    """Record the ``weight`` (and ``bias``) shapes of a Linear ``name`` with ``rows`` outputs and ``cols`` inputs."""
    out[f"{name}.weight"] = (rows, cols)
    if bias:
        out[f"{name}.bias"] = (rows,)
