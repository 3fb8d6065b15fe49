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

``MachineInfo.detect()`` reads torch.cuda (device count, memory, ``can_device_access_peer``) and
degrades to CPU ranks when no GPU is visible. ``ModelInfo.from_path()`` reads a diffusers folder
or a single .safetensors file (config / tensor shapes only, no weights are loaded).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..errors import ConfigError
from .config import ParallelConfig, parse_devices

GiB = 1024**3
ASSUMED_SIDE = 1024  # image side the planner assumes when the size is not known
DTYPE_BYTES: Mapping[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
FAMILIES: tuple[str, ...] = ("flux", "sd3", "pixart")
TOKEN_PIXELS = 16  # every supported family makes one token per 16x16 image pixels (VAE 8 x patch 2)
# Per family: typical head dim (to count heads from a single file), default CFG scale when unknown.
_HEAD_DIM = {"flux": 128, "sd3": 64, "pixart": 72}
_DEFAULT_CFG = {"flux": 1.0, "sd3": 4.5, "pixart": 4.5}
_TEXT_TOKENS = {"flux": 512, "sd3": 333, "pixart": 0}  # joint-attention text tokens (PixArt: cross-attention)
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4}


# -- machine --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """One device a worker can run on."""

    name: str  # "cuda:N" or "cpu"
    label: str  # e.g. "NVIDIA GeForce RTX 4090"
    total_bytes: int
    free_bytes: int


@dataclasses.dataclass(frozen=True)
class MachineInfo:
    """The devices offered to the workers and which pairs reach each other directly."""

    devices: tuple[DeviceInfo, ...]
    p2p: tuple[tuple[bool, ...], ...]  # p2p[i][j]: device i can read device j's memory directly

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n == 0:
            raise ConfigError(
                "the machine description has no devices",
                "the runtime starts one worker per device",
                "describe at least one device, or use MachineInfo.cpu(ranks) for CPU workers",
            )
        if len(self.p2p) != n or any(len(row) != n for row in self.p2p):
            raise ConfigError(
                f"the peer-access matrix is not {n} x {n}",
                "p2p[i][j] must say for every pair of devices whether i reaches j directly",
                "give one row of booleans per device",
            )

    @property
    def is_cpu(self) -> bool:
        return all(d.name == "cpu" for d in self.devices)

    def peer(self, i: int, j: int) -> bool:
        """Direct access both ways (a link an all-to-all can use at full speed)."""
        return i == j or (self.p2p[i][j] and self.p2p[j][i])

    def clique(self, indices: Sequence[int]) -> bool:
        return all(self.peer(a, b) for a in indices for b in indices)

    def describe(self) -> str:
        lines = [
            f"{d.name} {d.label}: {d.free_bytes / GiB:.1f} of {d.total_bytes / GiB:.1f} GiB free" for d in self.devices
        ]
        return "; ".join(lines)

    @classmethod
    def cpu(cls, ranks: int, memory_bytes: int | None = None) -> MachineInfo:
        """``ranks`` CPU worker processes sharing the machine's memory (all "peers": shared memory)."""
        if memory_bytes is None:
            memory_bytes = _available_ram()
        share = memory_bytes // max(ranks, 1)
        devs = tuple(DeviceInfo("cpu", "CPU", share, share) for _ in range(ranks))
        return cls(devs, tuple(tuple(True for _ in range(ranks)) for _ in range(ranks)))

    @classmethod
    def uniform(cls, count: int, memory_gib: float, p2p: bool, label: str = "GPU") -> MachineInfo:
        """A described machine of ``count`` identical GPUs, all with or all without peer access."""
        mem = int(memory_gib * GiB)
        devs = tuple(DeviceInfo(f"cuda:{i}", label, mem, mem) for i in range(count))
        return cls(devs, tuple(tuple(p2p or i == j for j in range(count)) for i in range(count)))

    @classmethod
    def detect(cls, devices: str | Sequence[str] | None = None) -> MachineInfo:
        """Read this machine: the listed devices (``"cuda:0,cuda:2"``, ``"cpu:2"``) or, with
        ``None`` / ``"all"``, every visible GPU. Without a GPU it describes one CPU rank.

        Free memory comes from NVML when available (no CUDA context is created on the GPUs),
        else from ``torch.cuda.mem_get_info``."""
        try:
            import torch

            cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # torch missing or broken CUDA driver: plan for CPU ranks
            cuda_count = 0
        if devices is None or (isinstance(devices, str) and devices.strip().lower() in ("", "all")):
            if cuda_count == 0:
                return cls.cpu(1)
            names = [f"cuda:{i}" for i in range(cuda_count)]
        else:
            names = parse_devices(devices)
        if all(n == "cpu" for n in names):
            return cls.cpu(len(names))
        ids = [int(n.split(":")[1]) for n in names]
        bad = [f"cuda:{i}" for i in ids if i >= cuda_count]
        if bad:
            raise ConfigError(
                f"device(s) {', '.join(bad)} requested but {cuda_count} CUDA GPU(s) are visible",
                "a worker can only use a GPU this process can see (CUDA_VISIBLE_DEVICES applies)",
                "list visible GPUs only, or use CPU ranks such as 'cpu:2'",
            )
        return cls(tuple(_cuda_device(i) for i in ids), tuple(tuple(_can_access(i, j) for j in ids) for i in ids))


def _cuda_device(index: int) -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    total = int(props.total_memory)
    try:
        free = total - int(torch.cuda.device_memory_used(index))  # NVML: no context on the GPU
    except Exception:
        free, total = (int(v) for v in torch.cuda.mem_get_info(index))
    return DeviceInfo(f"cuda:{index}", props.name, total, max(free, 0))


def _can_access(i: int, j: int) -> bool:
    if i == j:
        return True
    import torch

    try:
        return bool(torch.cuda.can_device_access_peer(i, j))
    except Exception:
        return False


def _available_ram() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * GiB


# -- model ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the planner needs to know about a transformer."""

    family: str
    num_heads: int
    num_layers: int  # blocks PipeFusion can split into stages
    hidden_size: int
    weight_bytes: int  # transformer weights in the run dtype

    @classmethod
    def from_path(cls, path: str | os.PathLike, family: str | None = None, dtype: str = "bf16") -> ModelInfo:
        """Read a diffusers folder (model_index.json + transformer/) or a single .safetensors file."""
        path = Path(path).expanduser()
        run_bytes = DTYPE_BYTES.get(dtype)
        if run_bytes is None:
            raise ConfigError(
                f"unknown dtype {dtype!r}", "weights are held in one float type", f"use one of {list(DTYPE_BYTES)}"
            )
        if path.is_dir():
            return _from_diffusers_folder(path, run_bytes)
        if path.is_file() and path.suffix == ".safetensors":
            return _from_single_file(path, family, run_bytes)
        raise ConfigError(
            f"model {path} does not exist"
            if not path.exists()
            else f"model {path} is not a folder or .safetensors file",
            "a model is a diffusers folder (with model_index.json) or a single .safetensors transformer file",
            "pick a folder under models/diffusers or a file under models/diffusion_models",
        )


def _from_diffusers_folder(path: Path, run_bytes: int) -> ModelInfo:
    cfg_file = path / "transformer" / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(
            f"{path} has no transformer/config.json",
            "the planner reads the transformer's head count and depth from its config",
            "point at the top folder of a diffusers pipeline (the one holding model_index.json)",
        )
    config = json.loads(cfg_file.read_text(encoding="utf-8"))
    cls_name = config.get("_class_name", "")
    family = {
        "FluxTransformer2DModel": "flux",
        "SD3Transformer2DModel": "sd3",
        "PixArtTransformer2DModel": "pixart",
    }.get(cls_name)
    if family is None:
        raise ConfigError(
            f"{path} holds a {cls_name or 'unknown'} transformer",
            "only Flux, SD3 and PixArt transformers have parallel adapters",
            "use a FLUX.1, SD3/3.5 or PixArt-alpha/sigma diffusers folder",
        )
    heads = int(config["num_attention_heads"])
    layers = int(config.get("num_layers", 0)) + int(config.get("num_single_layers", 0))
    hidden = heads * int(config["attention_head_dim"])
    params = sum(_safetensors_params(f) for f in sorted((path / "transformer").glob("*.safetensors")))
    return ModelInfo(family, heads, layers, hidden, params * run_bytes)


def read_safetensors_header(file: str | os.PathLike) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", ...} from a .safetensors header (reads only the header)."""
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ConfigError(
                f"{file} is empty or truncated",
                "a .safetensors file starts with its header size",
                "download the file again",
            )
        (size,) = struct.unpack("<Q", raw)
        if size > 100 * 1024**2:
            raise ConfigError(
                f"{file} has an implausible header ({size} bytes)",
                "the file is not a safetensors file",
                "check that the file is a .safetensors model",
            )
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header


def _safetensors_params(file: Path) -> int:
    return sum(math.prod(v.get("shape", [])) for v in read_safetensors_header(file).values())


_FAMILY_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (family, key fragments: any one present identifies it; checked in this order)
    ("flux", ("double_blocks.", "single_transformer_blocks.", "single_blocks.")),
    ("sd3", ("joint_blocks.", "context_embedder.weight", "transformer_blocks.0.ff_context")),
    ("pixart", ("adaln_single.", "t_block.", "y_embedder.", "caption_projection.")),
)


def detect_family(keys: Iterable[str]) -> str | None:
    """Family of a transformer state dict from its tensor names (diffusers or original layout)."""
    keys = list(keys)
    for family, markers in _FAMILY_MARKERS:
        if any(m in k for k in keys for m in markers):
            return family
    return None


def _count_blocks(keys: Iterable[str], prefixes: Sequence[str]) -> int:
    total = 0
    for prefix in prefixes:
        idx = {k[len(prefix) :].split(".", 1)[0] for k in keys if k.startswith(prefix)}
        total += len({i for i in idx if i.isdigit()})
    return total


def _from_single_file(path: Path, family: str | None, run_bytes: int) -> ModelInfo:
    header = read_safetensors_header(path)
    keys = [k.removeprefix("model.diffusion_model.") for k in header]
    found = detect_family(keys)
    if found is None:
        raise ConfigError(
            f"{path.name} does not look like a Flux, SD3 or PixArt transformer",
            "its tensor names match none of the supported families (is it a full checkpoint, a LoRA or a VAE?)",
            "use a transformer-only file (models/diffusion_models) of a supported family, or a diffusers folder",
        )
    if family is not None and family != found:
        raise ConfigError(
            f"{path.name} is a {found} transformer but family {family!r} was chosen",
            "the family decides which adapter splits the model; a wrong one cannot load the weights",
            f"set family to {found!r} (or 'auto')",
        )
    layers = _count_blocks(
        keys,
        (
            "double_blocks.",
            "single_blocks.",
            "transformer_blocks.",
            "single_transformer_blocks.",
            "joint_blocks.",
            "blocks.",
        ),
    )
    hidden = _hidden_size(header, found)
    params = sum(math.prod(v.get("shape", [])) for v in header.values())
    heads = max(hidden // _HEAD_DIM[found], 1)
    return ModelInfo(found, heads, layers, hidden, params * run_bytes)


def _hidden_size(header: Mapping[str, dict], family: str) -> int:
    for key, value in header.items():
        k = key.removeprefix("model.diffusion_model.")
        if k in ("img_in.weight", "x_embedder.proj.weight", "pos_embed.proj.weight", "x_embedder.weight"):
            return int(value["shape"][0])
    return _HEAD_DIM[family] * 24


# -- request and plan ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LayoutRequest:
    """What the generation will look like (the loader plans before the sampler's values are known,
    so these are the expected values; ``cfg=None`` means the family's usual scale)."""

    width: int | None = None  # None: not known yet (the loader runs before the sampler); planned for 1024
    height: int | None = None
    cfg: float | None = None
    batch_size: int = 1
    reserve_bytes: int = int(1.5 * GiB)  # left free per GPU for the CUDA context, VAE, fragmentation

    def cfg_for(self, family: str) -> float:
        return _DEFAULT_CFG.get(family, 1.0) if self.cfg is None else float(self.cfg)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) planned for: the given size, or 1024x1024 when it is not known."""
        return (self.width or ASSUMED_SIDE, self.height or ASSUMED_SIDE)

    @property
    def tokens(self) -> int:
        width, height = self.size
        return (height // TOKEN_PIXELS) * (width // TOKEN_PIXELS)

    @property
    def token_rows(self) -> int:
        return self.size[1] // TOKEN_PIXELS

    def describe_size(self) -> str:
        width, height = self.size
        if self.width is None or self.height is None:
            return f"{self.tokens} image tokens if the image is {width}x{height} (the loader cannot see the sampler's size)"
        return f"{self.tokens} image tokens ({width}x{height})"


@dataclasses.dataclass(frozen=True)
class LayoutPlan:
    """The chosen degrees, the order ranks are placed on the devices, and why."""

    config: ParallelConfig
    devices: tuple[str, ...]  # devices[rank]: ranks are placed in this order (ulysses innermost)
    pp_patches: int | None = None
    pp_stage_weights: tuple[float, ...] | None = None  # None: layers split evenly
    reason: str = ""

    def describe(self) -> str:
        extra = f", {self.pp_patches} patches" if self.pp_patches else ""
        if self.pp_stage_weights:
            extra += ", stage weights " + "/".join(f"{w:.2f}" for w in self.pp_stage_weights)
        return f"{self.config.describe()}{extra} on {','.join(self.devices)}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _activation_bytes(model: ModelInfo, request: LayoutRequest, share: int, branches: int) -> int:
    """Rough peak activations of one block on one rank: a share of the tokens, ~24 hidden-size
    tensors (q, k, v, attention output, 4x MLP, norms), in 2-byte floats."""
    tokens = request.tokens + _TEXT_TOKENS.get(model.family, 0)
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
        return LayoutPlan(ParallelConfig(), names, reason=f"1 {kind}: single-device run, nothing to split")

    cfg_scale = request.cfg_for(model.family)
    facts.append(request.describe_size())

    # 1. CFG parallel first when there are two branches to run.
    cfg = 1
    if cfg_scale > 1.0 and n % 2 == 0:
        cfg = 2
        facts.append(f"cfg {cfg_scale:g} > 1: CFG parallel puts cond and uncond on different halves (cfg=2)")
    elif cfg_scale > 1.0:
        facts.append(f"cfg {cfg_scale:g} > 1 but {n} devices cannot be halved: no CFG parallel")
    else:
        facts.append(f"cfg {cfg_scale:g}: one branch, no CFG parallel")
    group = n // cfg

    # 2. Does the whole model fit each device? If not, PipeFusion must split the layers.
    pp, weights = 1, None
    if not machine.is_cpu:
        pp, weights, fit_fact = _pipefusion_for_memory(machine, order, model, request, cfg, group)
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
        can_pp = model.num_layers >= pp * left and request.token_rows >= pp * left
        if p2p_rest or not can_pp:
            ring = left
            facts.append(
                f"ring={ring} for the rest of the sequence split"
                + (
                    ""
                    if p2p_rest
                    else f" (PipeFusion impossible: {model.num_layers} layers, {request.token_rows} token rows)"
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
    reason = f"{config.describe()}: " + "; ".join(facts)
    return LayoutPlan(config, names, patches, weights, reason)


def _pipefusion_for_memory(
    machine: MachineInfo, order: Sequence[int], model: ModelInfo, request: LayoutRequest, cfg: int, group: int
) -> tuple[int, tuple[float, ...] | None, str]:
    """Smallest pp degree whose stages fit; stage weights from free memory on mixed cards."""
    devs = [machine.devices[i] for i in order]
    smallest = min(devs, key=lambda d: d.free_bytes)
    gib = model.weight_bytes / GiB
    branches = 1 if cfg == 2 else (2 if request.cfg_for(model.family) > 1 else 1)
    for pp in _divisors(group):
        if pp > model.num_layers:
            break
        sp = group // pp
        act = _activation_bytes(model, request, sp, branches) + request.reserve_bytes
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
                    f"the model ({gib:.1f} GiB) fits on every device (smallest has {smallest.free_bytes / GiB:.1f} GiB free)",
                )
            continue
        even = all(c >= model.weight_bytes / pp for c in capacity)
        mixed = max(capacity) > 1.1 * min(capacity)
        if even and not mixed:
            return (
                pp,
                None,
                (
                    f"the model ({gib:.1f} GiB) does not fit one device ({smallest.label} {smallest.name}: "
                    f"{smallest.free_bytes / GiB:.1f} GiB free): PipeFusion pp={pp} splits its {model.num_layers} layers"
                ),
            )
        weights = tuple(c / sum(capacity) for c in capacity)
        if all(model.weight_bytes * w <= c for w, c in zip(weights, capacity)):
            frees = ", ".join(f"{d.free_bytes / GiB:.0f}" for d in devs)
            return (
                pp,
                tuple(round(w, 3) for w in weights),
                (
                    f"the model ({gib:.1f} GiB) does not fit one device ({smallest.label} {smallest.name}: "
                    f"{smallest.free_bytes / GiB:.1f} GiB free): PipeFusion pp={pp} with uneven stage weights "
                    f"from free memory ({frees} GiB free)"
                ),
            )
    total = sum(d.free_bytes for d in devs) / GiB
    raise ConfigError(
        f"the model needs about {gib:.1f} GiB of weights but the {len(devs)} device(s) have {total:.1f} GiB free "
        f"in all ({machine.describe()})",
        "even split into PipeFusion stages over every device, the layers do not fit next to activations and the reserve",
        "use bf16/fp16 instead of fp32, free GPU memory (close other programs, unload ComfyUI models), or add GPUs",
    )
