"""SD3 / SD3.5's text encoders from their files, as ComfyUI reads them: all three (``clip_l.safetensors``,
``clip_g.safetensors``, ``t5xxl_fp16`` / ``t5xxl_fp8_e4m3fn_scaled``; TripleCLIPLoader), any two (DualCLIPLoader
type "sd3") or one (CLIPLoader type "sd3"), in any order. The files are told apart by their headers: T5 by its
encoder tensors (``models.t5_text_file``; a T5-XXL encoder GGUF too), CLIPs by ``text_model.*``; of two CLIPs the
narrower is CLIP-L (768 vs 1280 wide), a lone CLIP is CLIP-G when 1280 wide, else CLIP-L.

The conditioning, as ComfyUI's SD3 text encoder gives it:
- CLIP-L (``models.clip_text_file``, tokens padded with its end token) and CLIP-G (``models.clip_projected_file``,
  padded with 0): the penultimate layer's states of every 77-token chunk of the prompt (``models.clip_chunks``:
  ComfyUI's chunks and ``(word:1.2)`` weights), side by side (cut to the shorter of the two), zero-padded on the
  right to T5's width (4096 without T5); a missing CLIP-L leaves its 768 columns zero on the left;
- T5: the prompt's tokens and the end token, padded with 0 to at least 77 tokens, encoded without an attention
  mask (the padding's states are kept), weighted tokens moved from the empty prompt's states; appended after the
  CLIP tokens (alone when no CLIP is given);
- pooled: CLIP-L's final-norm state at the first chunk's end token (not projected) and CLIP-G's projected one,
  side by side; zeros for a missing one (768 and 1280 wide).
Tokenizers are folders: ComfyUI's ``t5_tokenizer`` and ``sd1_tokenizer`` (both CLIPs). Weights are held in float16,
as ComfyUI holds them; CLIP computes in float32, T5 in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...clip_chunks import clip_chunk_states
from ...clip_projected_file import check_projected_clip_file, load_projected_clip_file
from ...clip_text_file import CLIP_G_WIDTH, TOKENS, check_clip_l_file, is_clip_text_file, load_clip_l_file
from ...t5_text_file import (
    END,
    PAD,
    check_t5xxl_file,
    encode_weighted,
    file_t5_sizes,
    folder_tokenizer_ids,
    load_t5_text_file,
    safetensors_shapes,
)
from ..spec import SecondEncoderFile, TextEncoderFile

WHAT = "T5-XXL (SD3's text encoder)"
CLIP_L_WHAT = "CLIP-L (SD3's text encoder)"
MIN_LENGTH = 77  # ComfyUI's SD3 T5 tokenizer pads to this many tokens
CLIP_L_WIDTH = 768  # what ComfyUI leaves zero for a missing CLIP-L (tokens and pooled)
T5_WIDTH = 4096  # what ComfyUI pads the CLIP tokens to without T5 (T5-XXL's width)
ORDER = ("t5", "clip_l", "clip_g")  # the readers' file order
LABELS = {"t5": "T5-XXL", "clip_l": "CLIP-L", "clip_g": "CLIP-G"}
FIX = "choose clip_l.safetensors, clip_g.safetensors and t5xxl_fp16 / t5xxl_fp8_e4m3fn_scaled.safetensors (or any two)"


def _file_kind(path: str) -> str | None:
    """ "clip" / "t5" by the file's header; None for neither."""
    if is_clip_text_file(path):
        return "clip"
    try:
        file_t5_sizes(path)
    except (OSError, ValueError, ConfigError):
        return None
    return "t5"


def roles(paths: Sequence[str]) -> list[str]:
    """Each file's encoder ("t5", "clip_l", "clip_g"; see the module doc), or a ConfigError for files that are not
    SD3's, or twice the same kind."""
    kinds = [_file_kind(p) for p in paths]
    clips = [i for i, kind in enumerate(kinds) if kind == "clip"]
    widths = {i: safetensors_shapes(paths[i])[TOKENS][1] for i in clips}
    if None in kinds or kinds.count("t5") > 1 or len(clips) > 2 or len(set(widths.values())) < len(clips):
        said = ", ".join(
            f"{Path(p).name}: {(f'CLIP {widths[i]} wide' if k == 'clip' else LABELS.get(k, k)) or 'none of these'}"
            for i, (p, k) in enumerate(zip(paths, kinds))
        )
        raise ConfigError(
            f"SD3's text-encoder files are not one each of T5-XXL, CLIP-L and CLIP-G ({said})",
            "SD3 reads up to three text encoders, one file each, as ComfyUI's TripleCLIPLoader (or DualCLIPLoader / "
            "CLIPLoader type sd3 with fewer); of two CLIPs the narrower is CLIP-L",
            FIX,
        )
    out = ["t5" if kind == "t5" else "clip_l" for kind in kinds]
    if len(clips) == 2:
        out[max(clips, key=widths.__getitem__)] = "clip_g"
    elif clips and widths[clips[0]] == CLIP_G_WIDTH:
        out[clips[0]] = "clip_g"
    return out


def arrange(paths: Sequence[str]) -> tuple[int, ...]:
    """The files' indices in the order (T5-XXL, CLIP-L, CLIP-G), those given."""
    found = roles(paths)
    return tuple(sorted(range(len(paths)), key=lambda i: ORDER.index(found[i])))


def load_sd3_t5_file(path, device="cpu", dtype=torch.bfloat16, storage="auto", overrides=None) -> nn.Module:
    """The T5-XXL encoder of ``path``, its weights held as ComfyUI holds a SD3 T5: in float16 (its text-encoder
    dtype; ``dtype``, the model's, is not used; T5 computes in float32 either way)."""
    return load_t5_text_file(path, device, torch.float16, storage, overrides, what=WHAT)


def _load_clip_l(path, device="cpu", dtype=None, storage="auto", overrides=None) -> nn.Module:
    return load_clip_l_file(path, device, CLIP_L_WHAT)


def _load_clip_g(path, device="cpu", dtype=None, storage="auto", overrides=None) -> nn.Module:
    return load_projected_clip_file(path, device, "CLIP-G")


LOAD = {"t5": load_sd3_t5_file, "clip_l": _load_clip_l, "clip_g": _load_clip_g}
CHECK = {
    "t5": lambda path: check_t5xxl_file(path, WHAT),
    "clip_l": lambda path: check_clip_l_file(path, CLIP_L_WHAT),
    "clip_g": lambda path: check_projected_clip_file(path, "CLIP-G"),
}


@torch.no_grad()
def _encode_prompt(parts: dict[str, tuple[nn.Module, object]], prompt: str, t5_length: int) -> Conditioning:
    device = next(next(iter(parts.values()))[0].parameters()).device
    pooled = {"clip_l": torch.zeros(1, CLIP_L_WIDTH, device=device), "clip_g": torch.zeros(1, CLIP_G_WIDTH)}
    clip_tokens = None
    if "clip_l" in parts:
        encoder, tokenizer = parts["clip_l"]
        clip_tokens, pooled["clip_l"] = clip_chunk_states(encoder, tokenizer, prompt, pad=None)
    if "clip_g" in parts:
        encoder, tokenizer = parts["clip_g"]
        states, pooled_g = clip_chunk_states(encoder, tokenizer, prompt, pad=0)
        pooled["clip_g"] = encoder.text_projection(pooled_g).float()
        if clip_tokens is None:
            clip_tokens = nn.functional.pad(states, (CLIP_L_WIDTH, 0))
        else:
            cut = min(clip_tokens.shape[1], states.shape[1])
            clip_tokens = torch.cat([clip_tokens[:, :cut], states[:, :cut]], dim=-1)
    tokens = []
    width = T5_WIDTH
    if "t5" in parts:
        encoder, tokenizer = parts["t5"]
        empty = lambda n: [END] + [PAD] * (n - 1)  # noqa: E731
        states, _ = encode_weighted(encoder, folder_tokenizer_ids(tokenizer), [prompt], t5_length, False, empty)
        tokens.append(states.float().to(device))
        width = states.shape[-1]
    if clip_tokens is not None:
        tokens.insert(0, nn.functional.pad(clip_tokens, (0, width - clip_tokens.shape[-1])).to(device))
    pooled_out = torch.cat([pooled["clip_l"].to(device), pooled["clip_g"].to(device)], dim=-1)
    return Conditioning(torch.cat(tokens, dim=-2), pooled_out)


def encode_sd3_files(
    kinds: tuple[str, ...], encoders, tokenizers, prompts: Sequence[str], max_sequence_length=MIN_LENGTH
):
    """SD3 conditioning of ``prompts`` (of equal token counts) from the ``kinds`` of encoders given (in ``ORDER``),
    ``encoders`` and ``tokenizers`` one each (a lone one: not in a tuple); ``max_sequence_length``: T5's least
    padded length."""
    if len(kinds) == 1:
        encoders, tokenizers = (encoders,), (tokenizers,)
    parts = dict(zip(kinds, zip(encoders, tokenizers)))
    conds = [_encode_prompt(parts, prompt, max_sequence_length) for prompt in prompts]
    return Conditioning(torch.cat([c.prompt_embeds for c in conds]), torch.cat([c.pooled for c in conds]))


def _reader(kinds: tuple[str, ...]) -> TextEncoderFile:
    """The reader of the files of ``kinds`` (in ``ORDER``)."""
    extra = [
        SecondEncoderFile(LABELS[k], LOAD[k], CHECK[k], lambda path, k=k: _file_kind(path) is not None)
        for k in kinds[1:]
    ]
    return TextEncoderFile(
        LABELS[kinds[0]],
        LOAD[kinds[0]],
        functools.partial(encode_sd3_files, kinds),
        MIN_LENGTH,
        check=CHECK[kinds[0]],
        second=extra[0] if extra else None,
        more=tuple(extra[1:]),
        arrange=arrange if len(kinds) > 1 else None,
        subset=_subset if len(kinds) == len(ORDER) else None,
    )


def _subset(paths: Sequence[str]) -> TextEncoderFile:
    return _reader(tuple(k for k in ORDER if k in roles(paths)))


ENCODER_FILE = _reader(ORDER)
