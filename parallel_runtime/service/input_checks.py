"""Host-side checks of a request's values before any worker or GPU work: types, upper bounds on the
work asked for, and finite numbers. Each failure is a ConfigError saying what, why and how to fix.

The bounds are ComfyUI's own input limits (KSampler: steps <= 10,000, seed < 2**64; latents: side
<= 16,384 px, batch <= 4,096), so any graph ComfyUI accepts passes. What the sampling settings mean
(sampler and scheduler names, defaults) is checked in api.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

import torch

from ..denoise.entries import CondEntry
from ..errors import ConfigError
from ..models.base import Conditioning

MAX_STEPS = 10_000
MAX_SIDE = 16_384
MAX_BATCH = 4_096
MAX_SCHEDULE = 1_000_000  # steps / denoise: ComfyUI's extreme is 10,000 steps at denoise 0.01
MAX_SIGMAS = MAX_STEPS + 1
SEED_LIMIT = 2**64


def whole_number(name: str, value: object, low: int, high: int, why: str) -> int:
    """``value`` as an int in [low, high] (bools and strings are refused, integral floats accepted)."""
    integral = isinstance(value, Integral) or (
        isinstance(value, Real) and math.isfinite(value) and float(value) == int(value)
    )
    if isinstance(value, bool) or not integral:
        raise ConfigError(
            f"{name}={value!r} is not a whole number", why, f"pass {name} as an integer between {low} and {high}"
        )
    number = int(value)
    if not low <= number <= high:
        raise ConfigError(f"{name}={number} is out of range", why, f"use a {name} between {low} and {high}")
    return number


def finite_number(name: str, value: object, why: str) -> float:
    """``value`` as a finite float (NaN and infinities are refused: they give an all-black image)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{name}={value!r} is not a number", why, f"pass {name} as a number, e.g. 1.0")
    number = float(value)
    if not math.isfinite(number):
        raise ConfigError(
            f"{name} is {number}",
            f"{why}; a NaN or infinite value turns every pixel into NaN (an all-black image)",
            f"pass a finite {name}",
        )
    return number


def positive_seconds(name: str, value: object) -> float:
    """A positive, finite number of seconds (a timeout)."""
    seconds = finite_number(name, value, f"{name} is a time limit in seconds")
    if seconds <= 0:
        raise ConfigError(f"{name}={seconds}", f"{name} is a time limit in seconds", "use a positive number")
    return seconds


def finite_tensor(name: str, tensor: torch.Tensor | None) -> None:
    """Refuse a tensor holding NaN or infinite values (names the input and how many)."""
    if tensor is None or not tensor.is_floating_point() or tensor.numel() == 0:
        return
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise ConfigError(
            f"the {name} holds {bad} NaN/infinite value(s) of {tensor.numel()}",
            "a single non-finite input value spreads to the whole image through attention",
            f"check the node that made the {name} (a broken VAE encode, an fp16 overflow upstream)",
        )


def conditioning(name: str, value: object, required: bool) -> None:
    """A CONDITIONING branch (a Conditioning, one CondEntry or a sequence of them): present when
    required, the right types, a batch of at least one, finite tensors and guidance."""
    if value is None:
        if required:
            raise ConfigError(
                f"no {name} conditioning was given",
                "the sampler needs the encoded prompt it should draw",
                f"connect a CONDITIONING to {name} (Parallel Text Encode, or ComfyUI's CLIP Text Encode)",
            )
        return
    entries = value if isinstance(value, (list, tuple)) and value else (value,)
    for index, entry in enumerate(entries):
        label = name if len(entries) == 1 else f"{name} entry {index + 1}"
        cond = entry.cond if isinstance(entry, CondEntry) else entry
        if not isinstance(cond, Conditioning):
            raise ConfigError(
                f"the {label} conditioning is a {type(cond).__name__}, not a Conditioning",
                "the sampler reads text embeddings from a Conditioning (prompt_embeds, pooled, attention_mask)",
                "pass the output of ParallelModel.encode_text (or the text encode node), or CondEntry items",
            )
        if cond.prompt_embeds.dim() != 3 or cond.prompt_embeds.shape[0] < 1:
            raise ConfigError(
                f"the {label} conditioning has embeddings of shape {tuple(cond.prompt_embeds.shape)}",
                "text embeddings are [batch, tokens, width] with a batch of at least one",
                "encode at least one prompt",
            )
        for field, tensor in cond.tensors().items():
            finite_tensor(f"{label} conditioning's {FIELD_NAMES.get(field, field.rpartition('.')[2])}", tensor)
        if isinstance(entry, CondEntry) and entry.guidance is not None:
            finite_number(f"{label} guidance", entry.guidance, "Flux's embedded guidance (FluxGuidance)")


FIELD_NAMES = {"prompt_embeds": "embeddings", "pooled": "pooled output"}


def sampling_values(
    *,
    width: object,
    height: object,
    batch_size: object,
    seed: object,
    steps: object,
    cfg: object,
    denoise: object,
    guidance: object = None,
    sigmas: torch.Tensor | None = None,
    latent: torch.Tensor | None = None,
) -> dict[str, object]:
    """Types, bounds and finiteness of a sample request; returns the values normalised (ints and
    floats). The work bound covers the schedule KSampler builds: ``steps / denoise`` sigmas."""
    out: dict[str, object] = {
        "width": whole_number("width", width, 1, MAX_SIDE, f"image sides go up to {MAX_SIDE} px (ComfyUI's limit)"),
        "height": whole_number("height", height, 1, MAX_SIDE, f"image sides go up to {MAX_SIDE} px (ComfyUI's limit)"),
        "batch_size": whole_number(
            "batch_size", batch_size, 1, MAX_BATCH, f"a batch holds 1 to {MAX_BATCH} images (ComfyUI's limit)"
        ),
        "seed": whole_number("seed", seed, 0, SEED_LIMIT - 1, "the noise generator takes a seed in [0, 2**64)"),
        "steps": whole_number("steps", steps, 1, MAX_STEPS, f"a schedule has 1 to {MAX_STEPS} steps (ComfyUI's limit)"),
        "cfg": finite_number("cfg", cfg, "cfg scales the difference between the positive and negative predictions"),
        "denoise": finite_number("denoise", denoise, "denoise is the fraction of the schedule to run"),
        "guidance": None if guidance is None else finite_number("guidance", guidance, "Flux's embedded guidance"),
    }
    denoise_value = out["denoise"]
    if 0.0 < denoise_value <= 1.0 and out["steps"] / denoise_value > MAX_SCHEDULE:
        raise ConfigError(
            f"steps={out['steps']} with denoise={denoise_value} asks for a schedule of "
            f"{out['steps'] / denoise_value:.3g} sigmas",
            f"KSampler builds steps/denoise sigmas and runs the last `steps`; more than {MAX_SCHEDULE:,} is "
            "not a meaningful schedule and would exhaust memory",
            f"use denoise >= {out['steps'] / MAX_SCHEDULE:.2g} (ComfyUI's denoise steps by 0.01)",
        )
    if sigmas is not None:
        sigma_tensor = torch.as_tensor(sigmas)
        if sigma_tensor.numel() > MAX_SIGMAS:
            raise ConfigError(
                f"the SIGMAS input has {sigma_tensor.numel()} values",
                f"a schedule has at most {MAX_STEPS} steps ({MAX_SIGMAS} sigmas)",
                "pass a shorter schedule",
            )
        finite_tensor("SIGMAS input", sigma_tensor.float())
    finite_tensor("LATENT", latent)
    return out


def prompts(values: object) -> list[str]:
    """One prompt or a non-empty list of prompts, each a string."""
    items = [values] if isinstance(values, str) else values
    if not isinstance(items, Sequence) or isinstance(items, (bytes, bytearray)) or not items:
        raise ConfigError(
            f"no prompt to encode ({values!r})",
            "text encoding turns each prompt into one conditioning",
            "pass a prompt string or a non-empty list of prompt strings",
        )
    bad = [type(p).__name__ for p in items if not isinstance(p, str)]
    if bad:
        raise ConfigError(
            f"prompts must be strings, got {', '.join(sorted(set(bad)))}",
            "the tokenizers read text",
            "pass str prompts",
        )
    for index, prompt in enumerate(items):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            label = "the prompt" if len(items) == 1 else f"prompt {index + 1}"
            raise ConfigError(
                f"{label} holds a lone surrogate (U+{ord(prompt[exc.start]):04X}) at character {exc.start}",
                "the tokenizers read UTF-8 text, and half of a surrogate pair is no character (a string cut "
                "in the middle of an emoji, or text decoded with 'surrogateescape')",
                "remove that character, or rebuild the text from its original bytes",
            ) from None
    return list(items)


def latent_sizes(latent: torch.Tensor) -> None:
    """A LATENT with every size at least 1 (a batch of 0, e.g. LatentFromBatch past the end, holds nothing)."""
    if min(latent.shape, default=0) < 1:
        raise ConfigError(
            f"the LATENT has shape {list(latent.shape)}",
            "a latent holds batch x channels x (frames x) height x width values, each size at least 1",
            "check the node that made it (an empty batch from LatentFromBatch / a batch slice past its end)",
        )


def decode_latent(latent: object, channels: int) -> torch.Tensor:
    """A raw VAE latent [B, C, H, W] (video: [B, C, T, H, W]) with this model's channel count, finite."""
    if not isinstance(latent, torch.Tensor) or latent.dim() not in (4, 5) or min(latent.shape, default=0) < 1:
        shape = tuple(latent.shape) if isinstance(latent, torch.Tensor) else type(latent).__name__
        raise ConfigError(
            f"cannot decode a LATENT of shape {shape}",
            "the VAE decodes a raw latent [batch, channels, (frames,) height, width] with every size at least 1",
            "connect the sampler's LATENT output",
        )
    if latent.shape[1] != channels:
        raise ConfigError(
            f"the LATENT has {latent.shape[1]} channels but this model's VAE decodes {channels}",
            "a latent can only be decoded by the VAE family that made it",
            "decode with the VAE of the model that sampled it",
        )
    finite_tensor("LATENT", latent)
    return latent
