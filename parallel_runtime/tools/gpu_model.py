"""A model of N GPUs from one GPU's measured times plus the bytes each parallel layout sends.

NCCL needs one GPU per rank, so with one GPU lent the multi-GPU figures are modelled: measured
single-GPU compute split over the GPUs, plus each layout's bytes per step (the formulas the tests
check against the bytes our collectives count) over a link of a given bandwidth. Assumptions, so
that the figures are read as what they are:

- compute splits perfectly over the GPUs of a layout (no loss from smaller per-GPU shapes, no
  kernel-launch overhead): a lower bound on time;
- Ulysses and Ring communication is not overlapped with compute (Ring could hide part of it);
- PipeFusion's point-to-point sends overlap compute (receives are posted ahead, as in the
  pipeline), its warmup steps run synchronously on the whole image, and the pipeline fills once
  per generation;
- bandwidth is per GPU and per direction (NVLink on H100: 450 GB/s; PCIe 4.0 x16: ~25 GB/s), with
  no latency term.

Per rank and step, with e bytes per element, batch B, sequence S = image + text tokens, hidden h
and L attention layers: Ulysses sends 4·e·B·S·h·L·(N−1)/N², Ring 2·e·B·S·h·L·(N−1)/N; a PipeFusion
stage boundary carries the image hidden states once per step plus, per patch, the text hidden
states and conditioning vectors; CFG gathers the other branch's prediction once per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..parallel.stages import plan_stages
from ..pipefusion.schedule import default_patches

LINKS: dict[str, float] = {"nvlink": 450e9, "pcie4_x16": 25e9}  # bytes per second per GPU and direction
LINK_NAMES = {"nvlink": "NVLink (H100, 450 GB/s)", "pcie4_x16": "PCIe 4.0 x16 (~25 GB/s)"}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one GPU measured for one model evaluation of the whole image (batch ``batch``)."""

    step_seconds: float  # embed + every block + output layer
    block_seconds: tuple[float, ...]  # each transformer block, in execution order
    embed_seconds: float
    final_seconds: float
    element_bytes: int
    batch: int
    image_tokens: int
    text_tokens: int
    hidden: int
    attention_layers: int
    boundary_image_bytes: int  # image hidden states of the whole image crossing one stage boundary
    boundary_item_bytes: int  # per item: text hidden states + conditioning vectors
    prediction_bytes: int  # one branch's prediction (what CFG parallel gathers)

    @property
    def sequence(self) -> int:
        return self.image_tokens + self.text_tokens

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["block_seconds"] = tuple(values["block_seconds"])
        return cls(**values)


def ulysses_bytes(p: Profile, n: int) -> float:
    return 4 * p.element_bytes * p.batch * p.sequence * p.hidden * p.attention_layers * (n - 1) / n**2


def ring_bytes(p: Profile, n: int) -> float:
    return 2 * p.element_bytes * p.batch * p.sequence * p.hidden * p.attention_layers * (n - 1) / n


def pipefusion_bytes(p: Profile, patches: int) -> float:
    """Bytes one stage boundary carries per patch-parallel step."""
    return p.boundary_image_bytes + patches * p.boundary_item_bytes


def ulysses_step(p: Profile, n: int, bandwidth: float) -> float:
    return p.step_seconds / n + ulysses_bytes(p, n) / bandwidth


def ring_step(p: Profile, n: int, bandwidth: float) -> float:
    return p.step_seconds / n + ring_bytes(p, n) / bandwidth


def cfg_step(p: Profile, n: int, bandwidth: float) -> float:
    """True CFG (two model evaluations per step) on cfg 2 x Ulysses n/2: each cfg half runs one
    branch over n/2 GPUs, then the halves exchange their predictions."""
    half = n // 2
    branch = ulysses_step(p, half, bandwidth) if half > 1 else p.step_seconds
    return branch + p.prediction_bytes / bandwidth


def stage_seconds(p: Profile, stage_counts: Sequence[int]) -> list[float]:
    """Compute time of each stage (blocks, plus the embedding on the first and output on the last)."""
    out, at = [], 0
    for s, count in enumerate(stage_counts):
        t = sum(p.block_seconds[at : at + count])
        at += count
        if s == 0:
            t += p.embed_seconds
        if s == len(stage_counts) - 1:
            t += p.final_seconds
        out.append(t)
    return out


def balanced_counts(block_seconds: Sequence[float], n: int) -> tuple[int, ...]:
    """Contiguous stage block counts minimising the slowest stage (exact, by dynamic programming)."""
    prefix = [0.0]
    for t in block_seconds:
        prefix.append(prefix[-1] + t)
    blocks = len(block_seconds)
    inf = float("inf")
    best = [[inf] * (blocks + 1) for _ in range(n + 1)]  # best[s][b]: first b blocks in s stages
    cut = [[0] * (blocks + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for s in range(1, n + 1):
        for b in range(s, blocks + 1):
            for a in range(s - 1, b):
                cost = max(best[s - 1][a], prefix[b] - prefix[a])
                if cost < best[s][b]:
                    best[s][b], cut[s][b] = cost, a
    counts, b = [], blocks
    for s in range(n, 0, -1):
        a = cut[s][b]
        counts.append(b - a)
        b = a
    return tuple(reversed(counts))


def pipefusion_seconds(
    p: Profile, n: int, steps: int, warmup: int, patches: int, bandwidth: float, counts: Sequence[int]
) -> float:
    """One image: ``warmup`` synchronous whole-image steps, then patch steps streaming across steps
    (each as slow as the slowest stage or the boundary transfer), plus one pipeline fill."""
    stages = stage_seconds(p, counts)
    whole_hop = (p.boundary_image_bytes + p.boundary_item_bytes) / bandwidth
    sync_step = sum(stages) + (n - 1) * whole_hop
    steady_step = max(max(stages), pipefusion_bytes(p, patches) / bandwidth)
    fill = (n - 1) * max(stages) / patches
    return warmup * sync_step + (steps - warmup) * steady_step + fill


def model_layouts(
    p: Profile, steps: int, gpus: Sequence[int] = (2, 4, 8), warmup: int = 1, token_rows: int = 64
) -> dict[str, Any]:
    """{link: {layout: {gpus: seconds per image}}}, with the single-GPU figures beside them."""
    out: dict[str, Any] = {}
    for link, bandwidth in LINKS.items():
        layouts: dict[str, dict[str, float]] = {
            "ulysses": {},
            "ring": {},
            "cfg2_x_ulysses": {},
            "pipefusion": {},
            "pipefusion_balanced": {},
        }
        for n in gpus:
            key = str(n)
            layouts["ulysses"][key] = steps * ulysses_step(p, n, bandwidth)
            layouts["ring"][key] = steps * ring_step(p, n, bandwidth)
            layouts["cfg2_x_ulysses"][key] = steps * cfg_step(p, n, bandwidth)
            if n <= len(p.block_seconds):
                m = default_patches(n, token_rows)
                equal = plan_stages(len(p.block_seconds), n).counts
                balanced = balanced_counts(p.block_seconds, n)
                layouts["pipefusion"][key] = pipefusion_seconds(p, n, steps, warmup, m, bandwidth, equal)
                layouts["pipefusion_balanced"][key] = pipefusion_seconds(p, n, steps, warmup, m, bandwidth, balanced)
        out[link] = layouts
    return out


def single_gpu_seconds(p: Profile, steps: int) -> dict[str, float]:
    """Per image on one GPU: without CFG (Flux dev) and with true CFG (two evaluations per step)."""
    return {"no_cfg": steps * p.step_seconds, "true_cfg": 2 * steps * p.step_seconds}
