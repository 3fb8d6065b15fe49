"""Host-side checks of a request's values before any worker or GPU work: types, upper bounds on the
work asked for, and finite numbers. Each failure is a ConfigError saying what, why and how to fix.

The bounds are ComfyUI's own input limits, written once in ``choices``, so any graph ComfyUI accepts passes. What the sampling settings mean
(sampler and scheduler names, defaults) is checked in api.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import torch

from ..denoise.entries import CondEntry
from ..errors import ConfigError
from ..models.base import Conditioning
from .choices import MAX_BATCH, MAX_SCHEDULE, MAX_SIDE, MAX_SIGMAS, MAX_STEPS, MIN_SIDE, SEED_LIMIT, SIZE_STEP


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


def choice(name: str, value: object, options: Sequence[object]) -> None:
    """``value`` is one of ``options`` (what a node's list offers; an API caller may pass anything)."""
    if value not in options:
        shown = ", ".join(repr(o) for o in options)
        raise ConfigError(
            f"{name} {value!r} is not one of the choices", f"{name} is one of: {shown}", f"pick one of {shown}"
        )


def schedule(steps: object, denoise: object) -> tuple[int, float]:
    """KSampler's steps and denoise: 1..MAX_STEPS steps, denoise in [0, 1], and a schedule KSampler can build
    (it makes ``steps / denoise`` sigmas and runs the last ``steps``)."""
    count = whole_number("steps", steps, 1, MAX_STEPS, f"a schedule has 1 to {MAX_STEPS} steps (ComfyUI's limit)")
    fraction = finite_number("denoise", denoise, "denoise is the fraction of the schedule to run")
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(
            f"denoise={fraction}",
            "denoise is the fraction of the schedule to run, in [0, 1] (0 returns the latent unchanged)",
            "use e.g. 1.0 for text to image or 0.6 for image to image",
        )
    if fraction > 0.0 and count / fraction > MAX_SCHEDULE:
        raise ConfigError(
            f"steps={count} with denoise={fraction} asks for a schedule of {count / fraction:.3g} sigmas",
            f"KSampler builds steps/denoise sigmas and runs the last `steps`; more than {MAX_SCHEDULE:,} is "
            "not a meaningful schedule and would exhaust memory",
            f"use denoise >= {count / MAX_SCHEDULE:.2g} (ComfyUI's denoise steps by 0.01)",
        )
    return count, fraction


def image_size(width: object, height: object, step: int = SIZE_STEP) -> tuple[int, int]:
    """An image's width and height in pixels: whole multiples of ``step`` (the VAE's factor) from
    ``MIN_SIDE`` to ``MAX_SIDE``, as ComfyUI's empty-latent nodes make them."""
    sides = []
    for name, value in (("width", width), ("height", height)):
        side = whole_number(name, value, MIN_SIDE, MAX_SIDE, f"image sides go from {MIN_SIDE} to {MAX_SIDE} px")
        if side % step:
            lower = max(MIN_SIDE, side // step * step)
            raise ConfigError(
                f"{name} {side} is not a multiple of {step}",
                f"the VAE shrinks the image {step}x, so each side is a whole number of latent pixels",
                f"use {name} {lower} or {lower + step}",
            )
        sides.append(side)
    return sides[0], sides[1]


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
        "cfg": finite_number("cfg", cfg, "cfg scales the difference between the positive and negative predictions"),
        "guidance": None if guidance is None else finite_number("guidance", guidance, "Flux's embedded guidance"),
    }
    out["steps"], out["denoise"] = schedule(steps, denoise)
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


def model_latent(latent: object, family: str, channels: int, dims: int, frame_axis: bool = False) -> torch.Tensor:
    """A LATENT's samples in the model's layout (see ``latent_layout``) with its channel count: as ComfyUI's
    KSampler does (``fix_empty_latent_channels``), an all-zero latent with another channel count
    (EmptyLatentImage's 4, a video's 16) becomes zeros with the model's."""
    latent = latent_layout(latent, family, dims, frame_axis)
    if latent.shape[1] != channels:
        if bool(torch.count_nonzero(latent)):
            raise ConfigError(
                f"the latent has {latent.shape[1]} channels but this {family} model works with {channels}",
                "a latent is only meaningful to the VAE (and model) that made it",
                f"encode the image with this model's VAE, or make an empty latent for it ({channels} channels)",
            )
        latent = torch.zeros(latent.shape[0], channels, *latent.shape[2:])
    return latent


def latent_layout(latent: object, family: str, dims: int, frame_axis: bool = False) -> torch.Tensor:
    """A LATENT's samples as the model takes them: [B, C, H, W] for an image model, [B, C, T, H, W] for a
    video model, every size at least 1. As ComfyUI does: an image family whose LATENT carries a frame axis of
    1 (``frame_axis``, Qwen-Image's [B, C, 1, H, W]) loses it; an image latent given to a video model is one
    frame."""
    if not isinstance(latent, torch.Tensor):
        raise ConfigError(
            f"the latent is a {type(latent).__name__}, not a tensor",
            "a LATENT holds its samples as a tensor",
            "connect Parallel Empty Latent, EmptySD3LatentImage, VAEEncode or another LATENT output",
        )
    if frame_axis and dims == 2 and latent.ndim == 5 and latent.shape[2] == 1:
        latent = latent[:, :, 0]
    if dims == 3 and latent.ndim == 4:
        latent = latent.unsqueeze(2)
    if latent.ndim != 2 + dims:
        shape = "[batch, channels, frames, height, width]" if dims == 3 else "[batch, channels, height, width]"
        raise ConfigError(
            f"the latent has shape {tuple(latent.shape)}",
            f"this {family} model takes latents {shape}",
            "use a video latent (EmptyHunyuanLatentVideo, WanImageToVideo, Parallel Empty Latent with length)"
            if dims == 3
            else "use an image latent (video latents are 5-D)",
        )
    latent_sizes(latent)
    return latent


def latent_sizes(latent: torch.Tensor) -> None:
    """A LATENT with every size at least 1 (a batch of 0, e.g. LatentFromBatch past the end, holds nothing)."""
    if min(latent.shape, default=0) < 1:
        raise ConfigError(
            f"the LATENT has shape {list(latent.shape)}",
            "a latent holds batch x channels x (frames x) height x width values, each size at least 1",
            "check the node that made it (an empty batch from LatentFromBatch / a batch slice past its end)",
        )


def decode_latent(
    latent: object, channels: int, family: str = "this", dims: int | None = None, frame_axis: bool = False
) -> torch.Tensor:
    """A raw VAE latent [B, C, H, W] (video: [B, C, T, H, W]) with this model's channel count, finite. With
    ``dims`` (the model's latent dimensions), in the model's layout first (see ``latent_layout``)."""
    if dims is not None and isinstance(latent, torch.Tensor) and min(latent.shape, default=0) >= 1:
        latent = latent_layout(latent, family, dims, frame_axis)  # (an empty one is named below)
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


def noise_mask(mask: Any, shape: tuple[int, ...]) -> None:
    """A LATENT's noise mask: an image's at any size ([H,W], [B,H,W], [B,1,H,W]: SetLatentNoiseMask keeps
    the image's pixels; the workers interpolate it as KSampler does), a video's at the latent's size or one value
    per frame ([B,1,T,1,1], as LTXVImgToVideo makes it; KSampler spreads it over the frame)."""
    video = len(shape) == 5
    if not isinstance(mask, torch.Tensor) or mask.ndim < 2 or mask.numel() == 0:
        raise ConfigError(
            f"the noise mask is {type(mask).__name__} of shape {tuple(getattr(mask, 'shape', ()))}",
            "a noise mask is a MASK: [height, width], [batch, height, width] or [batch, 1, height, width]",
            "make it with Set Latent Noise Mask or VAE Encode (for Inpainting) from a MASK",
        )
    per_frame = mask.ndim == 5 and tuple(mask.shape[-2:]) == (1, 1) and mask.shape[2] == shape[2]
    if video and tuple(mask.shape[-2:]) != tuple(shape[-2:]) and not per_frame:
        raise ConfigError(
            f"the noise mask has shape {tuple(mask.shape)}, the latent {shape}",
            "the parallel sampler takes a video's noise mask at the latent's own size (as Wan22ImageToVideoLatent "
            "makes it) or one value per latent frame ([batch, 1, frames, 1, 1], as LTXVImgToVideo makes it)",
            "make the latent and its mask with the same node",
        )
    if not video and mask.ndim == 4 and mask.shape[1] != 1:
        raise ConfigError(
            f"the noise mask has shape {tuple(mask.shape)}",
            "an image's noise mask has one channel ([batch, 1, height, width], as Set Latent Noise Mask makes it)",
            "make it with Set Latent Noise Mask or VAE Encode (for Inpainting) from a MASK",
        )
