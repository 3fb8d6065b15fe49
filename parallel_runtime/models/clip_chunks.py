"""A CLIP text tower's token states of a prompt as ComfyUI's CLIP text encoders give them (SD3's CLIP-L and CLIP-G
penultimate states), for the towers read by ``clip_text_file`` / ``clip_projected_file``.

Tokens: each weighted run of text (``prompt_weights.weighted_segments``) is tokenized on its own, without its start
and end tokens; runs fill chunks of ``length`` (77) tokens: the start token, the runs, the end token, padded with
``pad`` (CLIP-L: its end token; CLIP-G: 0). A run that does not fit the chunk's room is cut there when it has 8 or
more tokens (the chunk ends with the end token, the rest goes on in the next chunk), else the chunk is closed (end
token, padding) and the run moves whole to the next one. Every chunk is run through the tower (causal attention, no
padding mask); a token's state of weight w != 1 is moved from the empty prompt's state at its position (the start
and end tokens, then padding): ``empty + (state - empty) * w``. The chunks' states are concatenated along the tokens;
the pooled state is the first chunk's final-norm state at its first end token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .clip_text_file import KEEP_WHOLE_BELOW

CHUNK = 77  # CLIP's positions: a chunk of tokens


def weighted_chunks(
    runs: list[tuple[list[int], float]], start: int, end: int, pad: int, length: int = CHUNK
) -> list[tuple[list[int], list[float]]]:
    """(tokens, weights) of each ``length``-token chunk of a prompt's weighted token ``runs`` (see the module doc)."""
    chunks: list[tuple[list[int], list[float]]] = []
    ids, weights = [start], [1.0]

    def close(padding: int) -> None:
        nonlocal ids, weights
        chunks.append((ids + [end] + [pad] * padding, weights + [1.0] * (1 + padding)))
        ids, weights = [start], [1.0]

    for run, weight in runs:
        cut = len(run) >= KEEP_WHOLE_BELOW  # told by the whole run, also for what is left of it after a cut
        while run:
            room = length - 1 - len(ids)
            if len(run) <= room:
                ids, weights = ids + run, weights + [weight] * len(run)
                break
            if cut:
                ids, weights = ids + run[:room], weights + [weight] * room
                run = run[room:]
                close(0)
            else:
                close(room)
    close(max(length - 1 - len(ids), 0))
    return chunks


@torch.no_grad()
def clip_chunk_states(
    encoder: nn.Module, tokenizer, prompt: str, pad: int | None, layer: int = -2
) -> tuple[torch.Tensor, torch.Tensor]:
    """(states [1, chunks * 77, width] of hidden layer ``layer`` (not final-normed; -2: the penultimate), the
    pooled final-norm state [1, width]) of ``prompt`` (float32; see the module doc); ``pad``: the padding token
    (None: the end token). ``encoder``: transformers' ``CLIPTextModel`` or ``CLIPTextModelWithProjection``."""
    from .prompt_weights import apply_weights, weighted_segments

    start, end = tokenizer("").input_ids[:2]
    pad = end if pad is None else pad
    ids_of: Callable[[str], list[int]] = lambda text: list(tokenizer(text, truncation=False).input_ids[1:-1])  # noqa: E731
    runs = [(ids_of(text), weight) for text, weight in weighted_segments(prompt)]
    length = encoder.config.max_position_embeddings
    chunks = weighted_chunks(runs, start, end, pad, length)
    weighted = any(w != 1.0 for _, row in chunks for w in row)
    rows = [ids for ids, _ in chunks] + ([[start, end] + [pad] * (length - 2)] if weighted else [])
    device = next(encoder.parameters()).device
    out = encoder(input_ids=torch.tensor(rows, device=device), output_hidden_states=True)
    states = out.hidden_states[layer].float()
    first_end = chunks[0][0].index(end)
    pooled = out.last_hidden_state[:1, first_end].float()
    parts = states[: len(chunks)]
    if weighted:
        parts = apply_weights(parts, states[-1:], [row for _, row in chunks])
    return parts.reshape(1, -1, parts.shape[-1]), pooled
