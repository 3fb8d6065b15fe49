"""HiDream-I1's four text encoders from FOUR files, as ComfyUI's QuadrupleCLIPLoader reads them (any order):

- Llama-3.1-8B-Instruct (``llama_3.1_8b_instruct_fp8_scaled.safetensors``): Hugging Face's Llama names under
  ``model.``, no LM head; transformers' ``LlamaModel`` with the header's sizes, heads 128 wide, RoPE base 500000
  without Llama-3.1's long-context rescaling (ComfyUI's Llama runs plain RoPE), RMSNorm eps 1e-5. fp8-scaled files
  keep their Linear layers in fp8 as ComfyUI's scaled-fp8 layers (``prefixed_text_file``). The first file: when
  it is larger than one GPU's room, its layers are spread over the pool's GPUs (``load_job.text_file_placement``);
  the three others go to its first device. Its tokenizer is a folder (ComfyUI's ``llama_tokenizer``). Or a
  llama.cpp GGUF (general.architecture "llama", e.g. ``Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf``, as ComfyUI-GGUF's
  QuadrupleCLIPLoaderGGUF reads it; ``models.gguf.llama_text``): Linear weights kept in their GGML blocks, head
  width, RoPE base and norm epsilon from its ``llama.*`` metadata.
- T5-XXL (``t5xxl_fp16`` / ``t5xxl_fp8_e4m3fn_scaled``; ``models.t5_text_file``), weights in float16.
- CLIP-L and CLIP-G (``clip_l_hidream`` / ``clip_g_hidream``) with their projections (``clip_projected_file``);
  of the two CLIP files the narrower is CLIP-L (768 vs 1280 wide).

The conditioning, as ComfyUI's HiDream text encoder gives it:
- tokens: T5's states of the prompt's first 128-token chunk (its tokens and the end token, padded with 0 to 128
  when the prompt fits, else cut as ComfyUI cuts chunks: a weighted run of 8+ tokens is split, a shorter one left
  for the next chunk), T5 run WITH its attention mask (the padding's states are kept);
- pooled: CLIP-L's and CLIP-G's projected pooled outputs side by side [B, 768 + 1280];
- Llama: the start token and the prompt's tokens (never cut), padded with <|eot_id|> to 128, run with the padding
  masked; the hidden states after every layer, the last one final-normed (Hugging Face's ``hidden_states[1:]``)
  -> ``HiDreamText.llama3`` [B, layers, L, 4096].
Prompt weights ``(word:1.2)`` as ComfyUI applies them: a T5 token's state moves from the empty prompt's; CLIP's
pooled outputs do not change; on the Llama states ComfyUI's per-token loop runs over the stacked layer axis, so the
weight of token ``j`` (the start token is 0) moves the states of layer ``j`` (the embeddings are layer 0) from the
empty prompt's (the start token, then padding).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ....errors import ConfigError
from ...base import Conditioning
from ...clip_projected_file import check_projected_clip_file, clip_width, load_projected_clip_file, projected_pooled
from ...prefixed_text_file import decoder_config, load_prefixed_model
from ...prompt_weights import apply_weights, weighted_segments
from ...t5_text_file import END, PAD, check_t5xxl_file, file_t5_sizes, folder_tokenizer_ids, load_t5_text_file
from ..spec import SecondEncoderFile, TextEncoderFile
from .conditioning import HiDreamText

LENGTH = 128  # ComfyUI's HiDream tokenizer: T5's chunk and Llama's least padded length
KEEP_WHOLE_BELOW = 8  # ComfyUI moves a run of fewer tokens whole to the next chunk (its max_word_length)
LLAMA_PAD = "<|eot_id|>"  # what ComfyUI pads HiDream's Llama tokens with (id 128009)
LLAMA_31_8B: Mapping[str, Any] = {  # what the weights do not show, as ComfyUI's Llama runs it
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "max_position_embeddings": 131072,
    "hidden_act": "silu",
}
HEAD_DIM = 128
TEXT_PREFIX = "model."
LLAMA_WHAT = "Llama-3.1-8B-Instruct (HiDream's text encoder)"
T5_WHAT = "T5-XXL (HiDream's text encoder)"


def llama_text_config(shapes: Mapping[str, tuple[int, ...]], overrides: Mapping[str, Any] | None = None) -> dict:
    """The LlamaConfig entries of a ComfyUI Llama-3.1 file, from its header."""
    key = TEXT_PREFIX + "layers.0.self_attn.{}.weight"
    if TEXT_PREFIX + "embed_tokens.weight" not in shapes or key.format("q_proj") not in shapes:
        raise ConfigError(
            "the file does not hold a Llama text model (no model.embed_tokens / model.layers.0.self_attn.q_proj)",
            "HiDream's first text encoder is Llama-3.1-8B-Instruct, stored by ComfyUI under 'model.'",
            "pick llama_3.1_8b_instruct*.safetensors from models/text_encoders",
        )
    if key.format("q_norm") in shapes:
        raise ConfigError(
            "the file holds a Qwen3 text model (q_norm), not Llama-3.1",
            "HiDream's first text encoder is Llama-3.1-8B-Instruct",
            "pick llama_3.1_8b_instruct*.safetensors from models/text_encoders",
        )
    base = {**LLAMA_31_8B, **(overrides or {})}
    layers = len({k.split(".")[2] for k in shapes if k.startswith(TEXT_PREFIX + "layers.")})
    return decoder_config(shapes, TEXT_PREFIX, int(base.get("head_dim", HEAD_DIM)), layers, base)


def _is_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf")


def _safetensors_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    from ...t5_text_file import safetensors_shapes

    if not str(path).lower().endswith(".safetensors"):
        raise ConfigError(
            f"{Path(path).name} as HiDream's Llama-3.1 file",
            "HiDream's Llama-3.1 is read from a .safetensors file or a llama.cpp .gguf file",
            "pick llama_3.1_8b_instruct_fp8_scaled.safetensors (ComfyUI's models/text_encoders) or a Llama-3.1 GGUF",
        )
    return safetensors_shapes(path)


def check_llama_file(path: str) -> None:
    """On the host: ``path`` holds a Llama text model in ComfyUI's layout (a GGUF: of architecture llama)."""
    if _is_gguf(path):
        from ...gguf.llama_text import llama_gguf_overrides, open_llama_gguf

        file, shapes = open_llama_gguf(path, TEXT_PREFIX, LLAMA_WHAT)
        llama_text_config(shapes, llama_gguf_overrides(file, None))
        return
    llama_text_config(_safetensors_shapes(path))


def load_llama_file(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    storage: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> nn.Module:
    """The Llama-3.1 text model in ComfyUI's ``path`` (see the module doc), on ``device``, in ``dtype``."""
    from transformers import LlamaConfig, LlamaModel

    if _is_gguf(path):
        from ...gguf.llama_text import load_llama_gguf

        return load_llama_gguf(path, TEXT_PREFIX, LLAMA_WHAT, llama_text_config, device, dtype, storage, overrides)

    def build(shapes: Mapping[str, tuple[int, ...]]) -> nn.Module:
        return LlamaModel(LlamaConfig(**llama_text_config(shapes, overrides)))

    return load_prefixed_model(path, TEXT_PREFIX, build, device, dtype, storage, what="of the Llama text model")


def _kind(path: str) -> str | None:
    """Which of HiDream's encoders a file holds, by its header: "llama", "t5", "clip" or None."""
    try:
        if _is_gguf(path):
            from ...gguf.reader import GGUFFile

            return "llama" if GGUFFile(path).architecture == "llama" else None
        if clip_width(path) is not None:
            return "clip"
        if str(path).lower().endswith(".safetensors") and TEXT_PREFIX + "embed_tokens.weight" in _safetensors_shapes(
            path
        ):
            return "llama"
        file_t5_sizes(path)
        return "t5"
    except (OSError, ValueError, ConfigError):
        return None


def arrange(paths: Sequence[str]) -> tuple[int, ...]:
    """The four files' indices in the order (Llama, T5-XXL, CLIP-L, CLIP-G), told by their headers."""
    kinds = [_kind(p) for p in paths]
    found = {k: [i for i, kind in enumerate(kinds) if kind == k] for k in ("llama", "t5", "clip")}
    if len(found["llama"]) != 1 or len(found["t5"]) != 1 or len(found["clip"]) != 2:
        said = ", ".join(f"{Path(p).name}: {k or 'none of these'}" for p, k in zip(paths, kinds))
        raise ConfigError(
            f"HiDream's text-encoder files are not one Llama-3.1, one T5-XXL and two CLIPs ({said})",
            "HiDream reads four text encoders, one file each, as ComfyUI's QuadrupleCLIPLoader",
            "choose llama_3.1_8b_instruct* (.safetensors or a llama .gguf), t5xxl*, clip_l_hidream and clip_g_hidream "
            ".safetensors",
        )
    clip_l, clip_g = sorted(found["clip"], key=lambda i: clip_width(paths[i]))
    if clip_width(paths[clip_l]) == clip_width(paths[clip_g]):
        raise ConfigError(
            f"two CLIP files of the same width ({Path(paths[clip_l]).name}, {Path(paths[clip_g]).name})",
            "HiDream reads CLIP-L (768 wide) and CLIP-G (1280 wide)",
            "choose clip_l_hidream.safetensors and clip_g_hidream.safetensors",
        )
    return found["llama"][0], found["t5"][0], clip_l, clip_g


def _runs(tokenizer_ids, prompt: str) -> list[tuple[list[int], float]]:
    return [(tokenizer_ids(run), weight) for run, weight in weighted_segments(prompt)]


def t5_first_chunk(runs: list[tuple[list[int], float]], length: int) -> tuple[list[int], list[float]]:
    """(tokens, weights) of the prompt's first ``length``-token T5 chunk: padded to ``length`` when the prompt
    fits, else cut (see the module doc), ending with the end token."""
    ids: list[int] = []
    weights: list[float] = []
    for run, weight in runs:
        room = length - 1 - len(ids)
        if len(run) > room:
            if len(run) >= KEEP_WHOLE_BELOW:
                ids, weights = ids + run[:room], weights + [weight] * room
            return ids + [END], weights + [1.0]
        ids, weights = ids + run, weights + [weight] * len(run)
    pads = max(length - len(ids) - 1, 0)
    return ids + [END] + [PAD] * pads, weights + [1.0] * (pads + 1)


def _t5_states(encoder: nn.Module, tokenizer, prompt: str, length: int) -> torch.Tensor:
    ids, weights = t5_first_chunk(_runs(folder_tokenizer_ids(tokenizer), prompt), length)
    device = next(encoder.parameters()).device

    def run(row: list[int]) -> torch.Tensor:
        mask = torch.zeros(1, len(row), dtype=torch.long)
        mask[0, : row.index(END) + 1] = 1
        return encoder(torch.tensor([row], device=device), mask.to(device)).float()

    states = run(ids)
    if any(w != 1.0 for w in weights):
        empty = run([END] + [PAD] * (len(ids) - 1))
        states = apply_weights(states, empty, [weights])
    return states


def _llama_states(encoder: nn.Module, tokenizer, prompt: str, length: int) -> torch.Tensor:
    start = tokenizer("").input_ids[0]
    pad = tokenizer.convert_tokens_to_ids(LLAMA_PAD)
    ids_of = lambda text: list(tokenizer(text).input_ids[1:])  # noqa: E731 (ComfyUI drops the start token)
    ids, weights = [start], [1.0]
    for run, weight in _runs(ids_of, prompt):
        ids, weights = ids + run, weights + [weight] * len(run)
    ids += [pad] * max(length - len(ids), 0)
    weights += [1.0] * (len(ids) - len(weights))
    device = next(encoder.parameters()).device

    def run(row: list[int]) -> torch.Tensor:
        mask = torch.ones(1, len(row), dtype=torch.long)
        if pad in row:
            mask[0, row.index(pad) :] = 0
        out = encoder(
            input_ids=torch.tensor([row], device=device), attention_mask=mask.to(device), output_hidden_states=True
        )
        return torch.stack([h.float() for h in out.hidden_states], dim=1)  # [1, layers + 1, L, D]

    states = run(ids)
    layer_weights = weights[: states.shape[1]]
    if any(w != 1.0 for w in layer_weights):
        empty = run([start] + [pad] * (len(ids) - 1))
        w = torch.tensor(layer_weights, dtype=states.dtype, device=states.device).view(1, -1, 1, 1)
        states = torch.where(w != 1, (states - empty) * w + empty, states)
    return states[:, 1:]


@torch.no_grad()
def encode_hidream_files(encoders, tokenizers, prompts: Sequence[str], max_sequence_length: int = LENGTH):
    """HiDream conditioning of ``prompts`` from (Llama, T5, CLIP-L, CLIP-G) ``encoders`` and their ``tokenizers``
    (``max_sequence_length``: T5's chunk and Llama's least padded length; see the module doc)."""
    llama, t5, clip_l, clip_g = encoders
    llama_tok, t5_tok, clip_l_tok, clip_g_tok = tokenizers
    out = []
    for prompt in prompts:
        states = _t5_states(t5, t5_tok, prompt, max_sequence_length)
        pooled = torch.cat(
            [projected_pooled(clip_l, clip_l_tok, prompt), projected_pooled(clip_g, clip_g_tok, prompt)], -1
        )
        llama3 = _llama_states(llama, llama_tok, prompt, max_sequence_length)
        device = states.device
        out.append(Conditioning(states, pooled.to(device), extras=HiDreamText(llama3=llama3.to(device))))
    if len(out) == 1:
        return out[0]
    llama3 = torch.cat([c.extras.llama3 for c in out])  # prompts of equal Llama lengths (one batch)
    return Conditioning(
        torch.cat([c.prompt_embeds for c in out]), torch.cat([c.pooled for c in out]), None, HiDreamText(llama3=llama3)
    )


def _t5_file(kind: str) -> SecondEncoderFile:
    return SecondEncoderFile(
        kind,
        lambda path, device: load_t5_text_file(path, device, torch.float16, what=T5_WHAT),
        lambda path: check_t5xxl_file(path, T5_WHAT),
        lambda path: _kind(path) == "t5",
    )


def _clip_file(kind: str) -> SecondEncoderFile:
    return SecondEncoderFile(
        kind,
        lambda path, device: load_projected_clip_file(path, device, kind),
        lambda path: check_projected_clip_file(path, kind),
        lambda path: _kind(path) == "clip",
    )


ENCODER_FILE = TextEncoderFile(
    "Llama-3.1",
    load_llama_file,
    encode_hidream_files,
    LENGTH,
    check=check_llama_file,
    second=_t5_file("T5-XXL"),
    more=(_clip_file("CLIP-L"), _clip_file("CLIP-G")),
    arrange=arrange,
)
