"""Automatic layout planner: which parallel degrees to use on this machine for this model.

Pure Python (no torch.distributed). ``plan_layout(machine, model, request)`` decides from the
number of devices, peer-to-peer access between them (NVLink / PCIe P2P), free memory per device,
the transformer's head count and depth, the token count (resolution) and whether CFG is used:

1. The model must fit: sequence and CFG parallelism replicate the weights on every rank. When
   the weights (plus activations and a reserve) do not fit the smallest device, PipeFusion
   splits the layers into stages; stage sizes follow free memory when the cards differ.
2. CFG parallel first when cfg > 1 (two branches, one gather per step: cheap on any link).
3. Ulysses inside groups of GPUs that reach each other directly (NVLink / P2P), and only with a
   degree that divides the head count (its all-to-all is heavy and needs fast links).
4. What is left: Ring attention when those devices have P2P, PipeFusion across PCIe links
   without P2P (it sends only patch activations point to point).

The machine comes from :class:`~.machine.MachineInfo`; the model facts (:class:`ModelInfo`) from
the caller, who reads them from the model's files (``parallel_runtime.models.model_info``). What a model
family usually runs with (its CFG scale, its text tokens in the attention) comes in as data too
(:class:`LayoutHints`, which each family states in its folder): this wing knows no family.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

from ..errors import ConfigError
from .config import ParallelConfig
from .machine import CPU_MEMORY_ENV, GiB, MachineInfo, format_bytes
from .stages import balanced_counts, plan_stages

ASSUMED_SIDE = 1024  # image side the planner assumes when the size is not known
ASSUMED_VIDEO = (832, 480, 81)  # video width, height, frames assumed when not known (ComfyUI's Wan defaults)
TOKEN_PIXELS = 16  # one token per 16x16 image pixels (VAE 8 x patch 2); Wan 2.2 TI2V-5B: 32 (VAE 16 x patch 2)


# -- model ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayoutHints:
    """What a model family usually runs with, for planning before the sampler's values are known."""

    default_cfg: float = 1.0  # the CFG scale assumed when the request gives none (> 1: two branches)
    text_tokens: int = 0  # text tokens inside the attention sequence (0: cross-attention to the text)


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the planner needs to know about a transformer (read from its files by
    :func:`parallel_runtime.models.model_info.model_info_from_path`)."""

    family: str
    num_heads: int
    num_layers: int  # blocks PipeFusion can split into stages
    hidden_size: int
    weight_bytes: int  # transformer weights as they will be held (run dtype; fp8-stored layers 1 byte)
    block_bytes: tuple[int, ...] = ()  # per block in execution order (empty: weight_bytes spread evenly)
    embed_bytes: int = 0  # embedding layers (held by the first PipeFusion stage)
    final_bytes: int = 0  # output layers (held by the last stage)
    token_pixels: int = TOKEN_PIXELS  # image pixels per token side (VAE factor x patch size)
    frames_per_latent: int = 0  # video families: frames per latent frame (Wan: 4); 0 for image models
    hints: LayoutHints = LayoutHints()  # the family's usual CFG scale and text tokens
    storage_note: str = ""  # how the weights are stored when not in the run dtype (e.g. a GGUF's types)

    def stage_counts(self, pp: int, capacities: Sequence[float] | None = None) -> tuple[int, ...]:
        """Blocks per stage: balancing the bytes held (per capacity) when the block sizes are known,
        else proportional block counts (``plan_stages``)."""
        if len(self.block_bytes) == self.num_layers and self.num_layers:
            return balanced_counts(self.block_bytes, pp, self.embed_bytes, self.final_bytes, capacities)
        return plan_stages(self.num_layers, pp, capacities).counts

    def uniform_split(self, pp: int) -> bool:
        """Whether the byte-balanced split is the plain equal split (then no stage weights are needed)."""
        return self.stage_counts(pp) == plan_stages(self.num_layers, pp).counts

    def stage_bytes(self, counts: Sequence[int]) -> list[int]:
        """Weight bytes each PipeFusion stage holds when stage ``s`` runs the next ``counts[s]`` blocks."""
        if len(self.block_bytes) == self.num_layers and self.num_layers:
            per_block: Sequence[float] = self.block_bytes
            embed, final = self.embed_bytes, self.final_bytes
        else:
            per_block = [self.weight_bytes / max(self.num_layers, 1)] * max(self.num_layers, 1)
            embed = final = 0
        out, start = [], 0
        for s, count in enumerate(counts):
            held = sum(per_block[start : start + count]) + (embed if s == 0 else 0)
            out.append(int(held + (final if s == len(counts) - 1 else 0)))
            start += count
        return out


@dataclasses.dataclass(frozen=True)
class LayoutRequest:
    """What the generation will look like (the loader plans before the sampler's values are known,
    so these are the expected values; ``cfg=None`` means the family's usual scale)."""

    width: int | None = None  # None: not known yet (the loader runs before the sampler); planned for 1024
    height: int | None = None
    cfg: float | None = None
    batch_size: int = 1
    reserve_bytes: int = int(1.5 * GiB)  # left free per GPU for the CUDA context, VAE, fragmentation (not CPU)
    text_tokens: int | None = None  # joint-attention text tokens; None: the family's usual count
    frames: int | None = None  # video frames (None: 81 for a video model, not known yet)

    def cfg_for(self, model: ModelInfo) -> float:
        """The CFG scale planned for: the request's, else the model family's usual one."""
        return model.hints.default_cfg if self.cfg is None else float(self.cfg)

    def size(self, model: ModelInfo | None = None) -> tuple[int, int]:
        """(width, height) planned for: the given size, or the assumed one (1024x1024, 832x480 for video)."""
        video = model is not None and model.frames_per_latent > 0
        side_w, side_h = ASSUMED_VIDEO[:2] if video else (ASSUMED_SIDE, ASSUMED_SIDE)
        return (self.width or side_w, self.height or side_h)

    def latent_frames(self, model: ModelInfo | None = None) -> int:
        """Latent frames of the generation: 1 for images; 1 + (frames - 1) / 4 for Wan video."""
        if model is None or model.frames_per_latent == 0:
            return 1
        frames = self.frames or ASSUMED_VIDEO[2]
        return (frames - 1) // model.frames_per_latent + 1

    def tokens(self, model: ModelInfo | None = None) -> int:
        """Image (or video) tokens of one sample: frames x rows x cols."""
        width, height = self.size(model)
        pixels = TOKEN_PIXELS if model is None else model.token_pixels
        return self.latent_frames(model) * (height // pixels) * (width // pixels)

    def token_rows(self, model: ModelInfo | None = None) -> int:
        """Token rows PipeFusion can cut into patches (a video's frames stacked: frames x rows)."""
        pixels = TOKEN_PIXELS if model is None else model.token_pixels
        return self.latent_frames(model) * (self.size(model)[1] // pixels)

    def describe_size(self, model: ModelInfo | None = None) -> str:
        width, height = self.size(model)
        frames = self.latent_frames(model)
        what = f"{width}x{height}" if frames == 1 else f"{width}x{height}x{self.frames or ASSUMED_VIDEO[2]} frames"
        kind = "image" if frames == 1 else "video"
        if self.width is None or self.height is None or (frames > 1 and self.frames is None):
            return (
                f"{self.tokens(model)} {kind} tokens if the {kind} is {what} (the loader cannot see the sampler's size)"
            )
        return f"{self.tokens(model)} {kind} tokens ({what})"


@dataclasses.dataclass(frozen=True)
class LayoutPlan:
    """The chosen degrees, the order ranks are placed on the devices, and why."""

    config: ParallelConfig
    devices: tuple[str, ...]  # devices[rank]: ranks are placed in this order (ulysses innermost)
    pp_patches: int | None = None
    pp_stage_weights: tuple[float, ...] | None = None  # None: layers split evenly
    reason: str = ""
    stage_weight_bytes: tuple[int, ...] = ()  # weight bytes a rank of each PipeFusion stage holds (one entry: pp=1)

    def describe(self) -> str:
        extra = f", {self.pp_patches} patches" if self.pp_patches else ""
        if self.pp_stage_weights:
            extra += ", stage weights " + "/".join(f"{w:.2f}" for w in self.pp_stage_weights)
        return f"{self.config.describe()}{extra} on {','.join(self.devices)}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def activation_bytes(model: ModelInfo, request: LayoutRequest, share: int, branches: int) -> int:
    """Rough peak activations of one block on one rank: a share of the tokens, ~24 hidden-size
    tensors (q, k, v, attention output, 4x MLP, norms), in 2-byte floats."""
    text = model.hints.text_tokens if request.text_tokens is None else request.text_tokens
    tokens = request.tokens(model) + text
    return int(request.batch_size * branches * math.ceil(tokens / share) * model.hidden_size * 2 * 24)


def _ordered_devices(machine: MachineInfo) -> list[int]:
    """Device indices grouped by peer islands (connected components of mutual P2P access), so that
    the innermost mesh dimension (Ulysses) lands on neighbours that reach each other directly."""
    n = len(machine.devices)
    seen: set[int] = set()
    order: list[int] = []
    for start in range(n):
        if start in seen:
            continue
        stack, island = [start], []
        seen.add(start)
        while stack:
            i = stack.pop()
            island.append(i)
            for j in range(n):
                if j not in seen and machine.peer(i, j):
                    seen.add(j)
                    stack.append(j)
        order.extend(sorted(island))
    return order


def _blocks_are_cliques(machine: MachineInfo, order: Sequence[int], size: int) -> bool:
    return all(machine.clique(order[k : k + size]) for k in range(0, len(order), size))


def plan_layout(machine: MachineInfo, model: ModelInfo, request: LayoutRequest | None = None) -> LayoutPlan:
    """Choose cfg / pp / ring / ulysses degrees for ``model`` on ``machine`` (see module doc)."""
    request = request or LayoutRequest()
    n = len(machine.devices)
    order = _ordered_devices(machine)
    names = tuple(machine.devices[i].name for i in order)
    kind = "CPU rank" if machine.is_cpu else "GPU"
    facts = [f"{n} {kind}{'s' if n > 1 else ''}"]
    if n == 1:
        held = (model.weight_bytes,)
        reason = f"1 {kind}: single-device run, nothing to split; {weights_held(model, held)}"
        return LayoutPlan(ParallelConfig(), names, reason=reason, stage_weight_bytes=held)

    cfg_scale = request.cfg_for(model)
    facts.append(request.describe_size(model))

    # 1. CFG parallel first when there are two branches to run - unless each half cannot hold the model even
    # split into PipeFusion stages (CFG parallel holds the weights twice): memory comes first.
    # 2. Does the whole model fit each device? If not, PipeFusion must split the layers. (CPU ranks share the
    # host's memory: they are checked against their share of it, so only a model larger than that splits.)
    cfg = 2 if cfg_scale > 1.0 and n % 2 == 0 else 1
    try:
        pp, weights, fit_fact = _pipefusion_for_memory(machine, order, model, request, cfg, n // cfg)
    except ConfigError:
        if cfg == 1:
            raise
        cfg = 1
        pp, weights, fit_fact = _pipefusion_for_memory(machine, order, model, request, cfg, n)
        facts.append(f"cfg {cfg_scale:g} > 1 but the model needs every device's memory: no CFG parallel")
    else:
        if cfg == 2:
            facts.append(f"cfg {cfg_scale:g} > 1: CFG parallel puts cond and uncond on different halves (cfg=2)")
        elif cfg_scale > 1.0:
            facts.append(f"cfg {cfg_scale:g} > 1 but {n} devices cannot be halved: no CFG parallel")
        else:
            facts.append(f"cfg {cfg_scale:g}: one branch, no CFG parallel")
    group = n // cfg
    if not machine.is_cpu or pp > 1:
        facts.append(fit_fact)

    # 3. Ulysses inside P2P cliques, with a degree that divides the heads.
    rest = group // pp
    ulysses = 1
    for u in sorted(_divisors(rest), reverse=True):
        if u > 1 and model.num_heads % u == 0 and _blocks_are_cliques(machine, order, u):
            ulysses = u
            break
    if ulysses > 1:
        link = "shared memory" if machine.is_cpu else "NVLink/P2P"
        facts.append(f"ulysses={ulysses}: {link} between those devices and {model.num_heads} heads divide by {ulysses}")
    elif rest > 1:
        why = []
        if not any(model.num_heads % u == 0 for u in _divisors(rest) if u > 1):
            why.append(f"{model.num_heads} heads do not divide by {rest}")
        if not _blocks_are_cliques(machine, order, 2):
            why.append("no peer-to-peer access (PCIe without P2P)")
        facts.append("no Ulysses: " + ("; ".join(why) or "no fitting group"))

    # 4. The rest: Ring over P2P links, PipeFusion across links without P2P.
    ring = 1
    left = rest // ulysses
    if left > 1:
        p2p_rest = _blocks_are_cliques(machine, order, ulysses * left)
        can_pp = model.num_layers >= pp * left and request.token_rows(model) >= pp * left
        if p2p_rest or not can_pp:
            ring = left
            facts.append(
                f"ring={ring} for the rest of the sequence split"
                + (
                    ""
                    if p2p_rest
                    else f" (PipeFusion impossible: {model.num_layers} layers, {request.token_rows(model)} token rows)"
                )
            )
        else:
            pp *= left
            facts.append(f"pp={pp}: PipeFusion across PCIe without P2P (only patch activations cross those links)")

    config = ParallelConfig(cfg=cfg, pp=pp, ring=ring, ulysses=ulysses)
    patches = None
    if pp > 1:
        patches = pp  # one patch per stage keeps every stage busy once the pipeline streams
        if weights is not None and len(weights) != pp:
            weights = None
    if pp > 1 and weights is None and not model.uniform_split(pp):
        weights = model.stage_counts(pp)  # exact block counts that balance the bytes per stage
    held = (
        tuple(model.stage_bytes(plan_stages(model.num_layers, pp, weights).counts)) if pp > 1 else (model.weight_bytes,)
    )
    facts.append(weights_held(model, held))
    reason = f"{config.describe()}: " + "; ".join(facts)
    return LayoutPlan(config, names, patches, weights, reason, held)


def weights_held(model: ModelInfo, stage_bytes: Sequence[int]) -> str:
    """The reason text's statement of the weights each rank holds (per PipeFusion stage when split)."""
    note = f" ({model.storage_note})" if model.storage_note else ""
    if len(stage_bytes) == 1:
        return f"each rank holds the whole transformer, {format_bytes(stage_bytes[0])} of weights{note}"
    stages = ", ".join(f"stage {s}: {format_bytes(b)}" for s, b in enumerate(stage_bytes))
    return (
        f"each rank holds at most {format_bytes(max(stage_bytes))} of weights{note}, its stage's share of "
        f"{format_bytes(model.weight_bytes)} ({stages})"
    )


def _pipefusion_for_memory(
    machine: MachineInfo, order: Sequence[int], model: ModelInfo, request: LayoutRequest, cfg: int, group: int
) -> tuple[int, tuple[float, ...] | None, str]:
    """Smallest pp degree whose stages fit; stage weights from free memory on mixed cards."""
    devs = [machine.devices[i] for i in order]
    smallest = min(devs, key=lambda d: d.free_bytes)
    branches = 1 if cfg == 2 else (2 if request.cfg_for(model) > 1 else 1)
    for pp in _divisors(group):
        if pp > model.num_layers:
            break
        sp = group // pp
        # The reserve is for a GPU's CUDA context; CPU ranks' share of host memory keeps none (a busy host would
        # otherwise refuse even a tiny model).
        act = activation_bytes(model, request, sp, branches) + (0 if machine.is_cpu else request.reserve_bytes)
        # Stage s lives on the devices at pp-coordinate s of every cfg group (rank order cfg, pp, sp).
        capacity = []
        for s in range(pp):
            members = [devs[c * group + s * sp + k] for c in range(cfg) for k in range(sp)]
            capacity.append(max(min(d.free_bytes for d in members) - act, 0))
        if sum(capacity) <= 0:
            continue
        if pp == 1:
            if capacity[0] >= model.weight_bytes:
                return (
                    1,
                    None,
                    f"the model ({format_bytes(model.weight_bytes)}) fits on every device (smallest has {format_bytes(smallest.free_bytes)} free)",
                )
            continue
        even_counts = model.stage_counts(pp)
        even = all(c >= b for c, b in zip(capacity, model.stage_bytes(even_counts)))
        mixed = max(capacity) > 1.1 * min(capacity)
        if even and not mixed:
            return (
                pp,
                None if model.uniform_split(pp) else even_counts,
                (
                    f"the model ({format_bytes(model.weight_bytes)}) does not fit one device ({smallest.label} {smallest.name}: "
                    f"{format_bytes(smallest.free_bytes)} free): PipeFusion pp={pp} splits its {model.num_layers} layers"
                ),
            )
        weights = tuple(c / sum(capacity) for c in capacity)
        counts = model.stage_counts(pp, weights)
        if all(b <= c for b, c in zip(model.stage_bytes(counts), capacity)):
            frees = ", ".join(f"{d.free_bytes / GiB:.0f}" for d in devs)
            return (
                pp,
                tuple(round(w, 3) for w in weights) if not model.block_bytes else counts,
                (
                    f"the model ({format_bytes(model.weight_bytes)}) does not fit one device ({smallest.label} {smallest.name}: "
                    f"{format_bytes(smallest.free_bytes)} free): PipeFusion pp={pp} with uneven stage weights "
                    f"from free memory ({frees} GiB free)"
                ),
            )
    total = sum(d.free_bytes for d in devs)
    stated = (
        f"; CPU ranks: unset or raise ${CPU_MEMORY_ENV}" if machine.is_cpu and os.environ.get(CPU_MEMORY_ENV) else ""
    )
    raise ConfigError(
        f"the model needs about {format_bytes(model.weight_bytes)} of weights but the {len(devs)} device(s) have "
        f"{format_bytes(total)} free in all ({machine.describe()})",
        "even split into PipeFusion stages over every device, the layers do not fit next to activations and the reserve",
        "use bf16/fp16 instead of fp32, free GPU memory (close other programs, unload ComfyUI models), or add GPUs"
        + stated,
    )
