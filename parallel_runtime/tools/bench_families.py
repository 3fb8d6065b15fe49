"""``python -m parallel_runtime bench families``: every model family of the registry, side by side.

- ``weight_gb_per_rank``: for each shipped variant at its real config, the weights the largest PipeFusion stage
  holds at pp 1/2/4 (its blocks + the embedding or output layers), GB (1e9 bytes), bf16 and fp8 (every block
  Linear weight one byte, the rest bf16): byte accounting on the "meta" device, no weights, no GPU.
- ``tokens``: the image (or video) tokens at the family's usual size (``FamilySpec.default_size``) and the
  attention sequence with the text tokens the planner assumes (``LayoutHints.text_tokens``).
- ``ulysses2``: one sampling step on 2 CPU ranks with Ulysses 2 against 1 rank x 1 thread, on the family's
  widened tiny model (``dit_devtools.tiny.WIDENED``: 8 heads of 64, random weights) at ``TOKENS`` image tokens
  (an image ``PX`` px square; a video ``VIDEO_PX`` px square with as many latent frames as make the count); a family
  whose prompts come only from ComfyUI's encoders (nothing to encode on the workers) runs on random prompt
  embeddings of its shapes (``dit_devtools.tiny.random_prompts``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..checkout import devtools_module
from ..models.families.registry import FAMILIES
from ..models.families.spec import FamilySpec
from ..parallel.config import ParallelConfig
from ..parallel.layout import ModelInfo
from .bench_scaling import Contender
from .measure import interleave, ratio
from .report import machine

GB = 1e9
PX = 1024  # the widened tiny models' size for the speedup (4096 image tokens at 16 px a token, as bench scaling)
VIDEO_PX = 512  # a video's frame side; its latent frames bring the tokens to the image's count


def weight_gb(spec: FamilySpec, variant: str, storage: str) -> dict[str, float]:
    """GB the largest stage of ``variant`` holds at pp 1/2/4 (bf16 compute; ``storage`` as weights.WEIGHT_STORAGE)."""
    import diffusers

    from ..models.single_file import shipped_config
    from ..models.weight_budget import weight_budget

    config, _ = shipped_config(variant)
    budget = weight_budget(getattr(diffusers, config["_class_name"]), config, 2, storage=storage)
    info = ModelInfo(spec.id, 1, len(budget.blocks), 1, budget.total, budget.blocks, budget.embed, budget.final)
    return {f"pp{pp}": round(max(info.stage_bytes(info.stage_counts(pp))) / GB, 3) for pp in (1, 2, 4)}


def default_tokens(spec: FamilySpec, variant: str) -> dict[str, Any]:
    """Image (video) tokens at the family's usual size, and with the text tokens of its attention sequence."""
    from ..models.single_file import shipped_config

    config, _ = shipped_config(variant)
    pixels, frames_per_latent = spec.geometry(config.get("out_channels") or config.get("in_channels"))
    width, height, *frames = spec.default_size
    latent_frames = (frames[0] - 1) // frames_per_latent + 1 if frames and frames_per_latent else 1
    image = (width // pixels) * (height // pixels) * latent_frames
    return {
        "size": "x".join(str(s) for s in spec.default_size),
        "image_tokens": image,
        "sequence_tokens": image + spec.layout.text_tokens,
    }


def bench_size(spec: FamilySpec, folder: Path, px: int) -> tuple[int, int]:
    """(frame side px, latent frames) giving a widened tiny model of ``spec`` the image tokens of a ``px`` square."""
    config = json.loads((folder / "transformer" / "config.json").read_text())
    pixels, frames_per_latent = spec.geometry(config.get("out_channels") or config.get("in_channels"))
    tokens = (px // 16) ** 2
    if not frames_per_latent:
        return px, 1
    side = min(px, VIDEO_PX)
    return side, max(1, round(tokens / (side // pixels) ** 2))


def ulysses_speedup(spec: FamilySpec, name: str, root: Path, px: int, repeats: int) -> dict[str, Any]:
    """One step of the widened tiny ``name`` of ``spec``: Ulysses 2 x 1 thread against 1 rank x 1 thread (random
    prompt embeddings where no worker encodes the family's prompts)."""
    tiny = devtools_module("tiny", "bench families")
    overrides = tiny.WIDENED[name]
    path = tiny.build_tiny_pipeline(name, root / f"{name}-wide", **overrides)
    side, frames = bench_size(spec, path, px)
    cfg = spec.generate_cfg
    prompts = None if spec.text_encoding().on_workers else tiny.random_prompts(name)
    contenders: dict[str, Contender] = {}
    try:
        for label, config in (
            ("1 rank x 1 thread", ParallelConfig()),
            ("ulysses 2 ranks x 1 thread", ParallelConfig(ulysses=2)),
        ):
            contenders[label] = Contender(path, config, 1, side, 1, cfg, frames, prompts)
        times = interleave(contenders, repeats=repeats, warmup=1)
        info = contenders["1 rank x 1 thread"].info
    finally:
        for c in contenders.values():
            c.close()
    size = f"{side}x{side} px" + (f" x {frames} latent frames" if info["latent_dims"] == 3 else "")
    return {
        "config": f"{name} widened: {overrides}, {info['num_blocks']} blocks, {size}, cfg {cfg}"
        + ("" if prompts is None else ", random prompt embeddings (128 tokens)"),
        "seconds": {k: v.summary() for k, v in times.items()},
        "speedup": ratio(times, "1 rank x 1 thread", "ulysses 2 ranks x 1 thread"),
    }


def run(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    px, repeats = (512, 1) if quick else (PX, 3)
    tiny = devtools_module("tiny", "bench families")
    res: dict[str, Any] = {
        "model": "every family's shipped configs on the meta device (weights per rank: byte accounting, no weights, "
        f"no GPU); speed: each family's widened tiny model (random fp32 weights, 512 wide) at {px}x{px} px, one step",
        "baseline": "weights: pp=1 (the whole transformer, what Ulysses / Ring / CFG hold per rank); speed: 1 rank x 1 "
        "thread (so Ulysses 2 ranks x 1 thread models 2 GPUs against 1), median of interleaved rounds",
        "machine": machine(),
        "families": {},
    }
    with tempfile.TemporaryDirectory(prefix="families-bench-") as tmp:
        for spec in FAMILIES:
            row: dict[str, Any] = {"label": spec.label, "variants": {}}
            for variant in spec.variants:
                row["variants"][variant] = {
                    "weight_gb_per_rank": weight_gb(spec, variant, "auto"),
                    "weight_gb_per_rank_fp8": weight_gb(spec, variant, "fp8_e4m3fn"),
                    "tokens": default_tokens(spec, variant),
                }
            name = tiny.WIDENED_NAMES.get(spec.id, f"tiny-{spec.id}")
            if name in tiny.WIDENED:
                row["ulysses2"] = ulysses_speedup(spec, name, Path(tmp), px, repeats)
            res["families"][spec.id] = row
    return res
