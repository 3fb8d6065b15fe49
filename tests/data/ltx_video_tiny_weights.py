"""Tiny LTX-Video 0.9 transformers in Lightricks' layout (what ComfyUI's LTX-Video files hold), with portable
deterministic weights.

Shared by ``make_comfy_ltx_video_reference.py`` (which runs ComfyUI's own code on them) and the tests (which run
ours on the same weights and compare). Pure torch: no ComfyUI and no repository import. ComfyUI derives the head
width as ``width // 32`` and builds the caption projection for T5-XXL's 4096 features, so the tiny model has 32
heads of 2 and a 4096-wide text input (~0.5 M parameters: generated, not stored, see ``wan_tiny_weights``).
"""

from __future__ import annotations

import dataclasses

import torch
from wan_tiny_weights import hashed_uniform


@dataclasses.dataclass(frozen=True)
class TinyLTXVideo:
    """Structure of a tiny LTX-Video transformer (original names)."""

    head_dim: int = 2  # ComfyUI: 32 heads, head width = width // 32
    blocks: int = 2
    channels: int = 128  # the LTX VAE's latent channels
    text_dim: int = 4096  # T5-XXL (ComfyUI's LTXVModel default caption_channels)

    @property
    def width(self) -> int:
        return 32 * self.head_dim


def _linear(out: dict, name: str, rows: int, cols: int) -> None:
    out[f"{name}.weight"] = ((rows, cols), f"w{cols}")
    out[f"{name}.bias"] = ((rows,), "bias")


def original_shapes(cfg: TinyLTXVideo) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> (shape, kind): kinds ``w<fan_in>`` (linear), ``bias``, ``norm`` (scale around 1), ``table``."""
    d = cfg.width
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    _linear(out, "patchify_proj", d, cfg.channels)
    _linear(out, "adaln_single.emb.timestep_embedder.linear_1", d, 256)
    _linear(out, "adaln_single.emb.timestep_embedder.linear_2", d, d)
    _linear(out, "adaln_single.linear", 6 * d, d)
    _linear(out, "caption_projection.linear_1", d, cfg.text_dim)
    _linear(out, "caption_projection.linear_2", d, d)
    out["scale_shift_table"] = ((2, d), "table")
    for i in range(cfg.blocks):
        b = f"transformer_blocks.{i}."
        out[b + "scale_shift_table"] = ((6, d), "table")
        for attn in ("attn1", "attn2"):
            for proj in ("to_q", "to_k", "to_v", "to_out.0"):
                _linear(out, f"{b}{attn}.{proj}", d, d)
            out[f"{b}{attn}.q_norm.weight"] = ((d,), "norm")
            out[f"{b}{attn}.k_norm.weight"] = ((d,), "norm")
        _linear(out, b + "ff.net.0.proj", 4 * d, d)
        _linear(out, b + "ff.net.2", d, 4 * d)
    _linear(out, "proj_out", cfg.channels, d)
    return out


def _values(name: str, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    if kind.startswith("w"):
        return hashed_uniform(name, shape, 3**0.5 / int(kind[1:]) ** 0.5)  # std 1/sqrt(fan_in)
    if kind == "norm":
        return hashed_uniform(name, shape, 0.1, 1.0)
    if kind == "table":
        return hashed_uniform(name, shape, 0.2)
    return hashed_uniform(name, shape, 0.05)


def tiny_ltx_video_state_dict(cfg: TinyLTXVideo, salt: str = "ltx") -> dict[str, torch.Tensor]:
    """Original-layout state dict of ``cfg``; ``salt`` gives a different model."""
    return {name: _values(f"{salt}/{name}", shape, kind) for name, (shape, kind) in original_shapes(cfg).items()}
