"""ComfyUI's prompt-weight syntax for T5 text encoders: ``(text)`` multiplies the weight of ``text`` by 1.1,
``(text:1.3)`` sets it, groups nest, ``\\(`` / ``\\)`` are literal parentheses. Each run of text is tokenized on its
own; a weighted token's state is moved away from the state an empty prompt gives at the same position:
``empty + (state - empty) * weight`` (tokens of weight 1 are left as encoded).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

OPEN, CLOSE = "\x00\x02", "\x00\x01"  # escaped parentheses, kept out of the parser's way


def _groups(text: str) -> list[str]:
    """Top-level pieces of ``text``: plain runs and whole ``( ... )`` groups (an unclosed group runs to the end;
    a stray ``)`` closes nothing and stays in the text)."""
    pieces: list[str] = []
    run, depth = "", 0
    for char in text:
        if char == "(" and depth == 0:
            if run:
                pieces.append(run)
            run, depth = "(", 1
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                pieces.append(run + ")")
                run = ""
                continue
        run += char
    if run:
        pieces.append(run)
    return pieces


def _weighted(text: str, weight: float) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for piece in _groups(text):
        if len(piece) < 2 or not (piece.startswith("(") and piece.endswith(")")):
            out.append((piece, weight))
            continue
        inner, inner_weight = piece[1:-1], weight * 1.1
        colon = inner.rfind(":")
        if colon > 0:
            try:
                inner_weight = float(inner[colon + 1 :])
                inner = inner[:colon]
            except ValueError:
                pass
        out += _weighted(inner, inner_weight)
    return out


def weighted_segments(text: str) -> list[tuple[str, float]]:
    """(run of text, weight) of a prompt in ComfyUI's syntax (see the module doc); empty runs dropped."""
    escaped = text.replace("\\)", CLOSE).replace("\\(", OPEN)
    out = []
    for run, weight in _weighted(escaped, 1.0):
        run = run.replace(CLOSE, ")").replace(OPEN, "(")
        if run:
            out.append((run, weight))
    return out


def weighted_tokens(text: str, ids_of: Callable[[str], list[int]], end: int) -> tuple[list[int], list[float]]:
    """(token ids ending with ``end``, their weights) of a prompt; ``ids_of(run)``: a run's tokens, no end token."""
    ids: list[int] = []
    weights: list[float] = []
    for run, weight in weighted_segments(text):
        tokens = ids_of(run)
        ids += tokens
        weights += [weight] * len(tokens)
    return ids + [end], weights + [1.0]


def apply_weights(states: torch.Tensor, empty: torch.Tensor, weights: list[list[float]]) -> torch.Tensor:
    """``states`` [B, L, D] with each weighted token moved from ``empty`` [1, L, D] (the empty prompt's states)."""
    w = torch.ones(states.shape[:2], dtype=states.dtype, device=states.device)
    for i, row in enumerate(weights):
        w[i, : len(row)] = torch.tensor(row, dtype=states.dtype)
    w = w.unsqueeze(-1)
    return torch.where(w != 1, (states - empty) * w + empty, states)
