"""Qwen-Image-Edit prompts with their reference images inside, as ComfyUI's TextEncodeQwenImageEdit ("edit": one
image) and TextEncodeQwenImageEditPlus ("edit_plus", 2509: up to three, each announced as "Picture N:") build them.

The prompt goes into the edit chat template; each image is one ``<|vision_start|><|image_pad|><|vision_end|>``
whose ``<|image_pad|>`` becomes the vision tower's tokens for it (``vision.vision_tokens``). The image is first
scaled to an area (the sides rounded): 1024x1024 for "edit" (the picture the reference latent is made from),
384x384 for "edit_plus". Positions are Qwen2.5-VL's 3-D M-RoPE ones (transformers' ``get_rope_index`` for
images): text tokens count up on all three axes; an image's tokens all take the next position on the time axis
and that plus their row / column on the other two; the text after it starts past the image's largest position.
The last hidden state is kept from the first token after the template's "<|im_start|>user\\n" (the system
message dropped; the image tokens stay). Nothing is truncated (ComfyUI keeps every token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...base import Conditioning
from ...text_parts import loaded_device_of
from .text import QWEN_TEMPLATE
from .vision import vision_tokens

MODES = ("edit", "edit_plus")
MAX_IMAGES = {"edit": 1, "edit_plus": 3}
EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
IMAGE_SLOT = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
USER_TURN = "<|im_start|>user\n"
IMAGE_AREA = {"edit": 1024 * 1024, "edit_plus": 384 * 384}


def edit_prompt_text(prompt: str, pictures: Sequence[int], mode: str) -> str:
    """The text the tokenizer sees: "edit" puts its image before the prompt, "edit_plus" names each by its input
    ("Picture 2: ..." for an image on image2, whatever image1 holds); "edit" with no image is Qwen-Image's plain
    prompt."""
    if mode == "edit":
        return EDIT_TEMPLATE.format(IMAGE_SLOT + prompt) if pictures else QWEN_TEMPLATE.format(prompt)
    slots = "".join(f"Picture {n}: {IMAGE_SLOT}" for n in pictures)
    return EDIT_TEMPLATE.format(slots + prompt)


def area_scaled(image: torch.Tensor, area: int) -> torch.Tensor:
    """``image`` ([H, W, C]) scaled to about ``area`` pixels, its aspect kept (each side rounded), by area
    averaging (ComfyUI's "area" upscale method)."""
    height, width = image.shape[0], image.shape[1]
    scale = math.sqrt(area / (height * width))
    size = (round(height * scale), round(width * scale))
    return F.interpolate(image.movedim(-1, 0).unsqueeze(0).float(), size=size, mode="area")[0].movedim(0, -1)


def reference_pixels(image: torch.Tensor, mode: str) -> torch.Tensor:
    """The IMAGE ([B, H, W, C]) a reference latent is encoded from, as ComfyUI's nodes scale it: about 1024x1024
    pixels by area averaging, the sides rounded ("edit") or rounded to multiples of 8 ("edit_plus"); 3 channels."""
    height, width = image.shape[1], image.shape[2]
    scale = math.sqrt(IMAGE_AREA["edit"] / (height * width))
    if mode == "edit":
        size = (round(height * scale), round(width * scale))
    else:
        size = (round(height * scale / 8.0) * 8, round(width * scale / 8.0) * 8)
    pixels = F.interpolate(image.movedim(-1, 1).float(), size=size, mode="area").movedim(1, -1)
    return pixels[..., :3]


def mrope_positions(pieces: Sequence[int | tuple[int, int]]) -> torch.Tensor:
    """[3, L] positions of a sequence given as text runs (their length) and images (merged rows, columns)."""
    columns, start = [], 0
    for piece in pieces:
        if isinstance(piece, tuple):
            rows, cols = piece
            row = torch.arange(rows).repeat_interleave(cols)
            col = torch.arange(cols).repeat(rows)
            columns.append(torch.stack([torch.zeros_like(row), row, col]) + start)
            start += max(rows, cols)
        else:
            columns.append(torch.arange(start, start + piece).expand(3, -1))
            start += piece
    return torch.cat(columns, dim=1)


@torch.no_grad()
def encode_qwen_image_edit(
    encoder: nn.Module,
    tower: nn.Module | None,
    tokenizer,
    prompts: Sequence[str],
    images: Sequence[torch.Tensor | None],
    mode: str = "edit_plus",
) -> Conditioning:
    """Conditioning of ``prompts``, each with ``images`` ([H, W, C] or [B, H, W, C] in [0, 1]; the first of a
    batch, as ComfyUI; None: an input left empty, which keeps the pictures' numbers) in it."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    if len(images) > MAX_IMAGES[mode]:
        raise ValueError(f"{len(images)} images for {mode}: at most {MAX_IMAGES[mode]}")
    pictures = [n + 1 for n, image in enumerate(images) if image is not None]
    images = [image for image in images if image is not None]
    device = loaded_device_of(encoder)
    table = encoder.get_input_embeddings()
    seen = []
    for image in images:
        image = image[0] if image.ndim == 4 else image
        tokens, grid = vision_tokens(tower, area_scaled(image, IMAGE_AREA[mode]))
        seen.append((tokens.to(device, table.weight.dtype), grid))
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    kept = []
    for prompt in prompts:
        text = edit_prompt_text(prompt, pictures, mode)
        ids = tokenizer(text, return_tensors="pt").input_ids[0].to(device)
        template = EDIT_TEMPLATE if seen or mode == "edit_plus" else QWEN_TEMPLATE
        drop = len(tokenizer(template.split(USER_TURN)[0] + USER_TURN).input_ids)
        embeds, pieces, run = [], [], []
        slots = iter(seen)
        for token in [*ids.tolist(), None]:
            slot = next(slots, None) if token == pad else None
            if token is not None and slot is None:
                run.append(token)
                continue
            if run:
                embeds.append(table(torch.tensor(run, device=device)))
                pieces.append(len(run))
                run = []
            if slot is not None:
                embeds.append(slot[0])
                pieces.append(slot[1])
        sequence = torch.cat(embeds).unsqueeze(0)
        positions = mrope_positions(pieces).to(device).unsqueeze(1)
        hidden = encoder(inputs_embeds=sequence, position_ids=positions, output_hidden_states=True).hidden_states[-1]
        kept.append(hidden[0, drop:])
    length = max(k.shape[0] for k in kept)
    embeds = torch.stack([torch.cat([k, k.new_zeros(length - k.shape[0], k.shape[1])]) for k in kept])
    valid = torch.stack([torch.arange(length, device=device) < k.shape[0] for k in kept]).long()
    return Conditioning(embeds, None, None if bool(valid.all()) else valid)
