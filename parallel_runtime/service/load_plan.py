"""A load planned from a user's choices: the model, the devices ("all" or a list), an automatic or manual layout,
precision, the VAE. What the Parallel Model Loader node hands over, as words and numbers, becomes a
:class:`LoadRequest` here, every choice checked before any worker starts or any memory is freed.

The choice lists and limits the node shows are ``choices``' (the node declares its inputs from them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ..errors import ConfigError
from ..parallel.config import ParallelConfig, check_visible, parse_devices, validate_layout
from ..parallel.layout import ModelInfo
from . import input_checks
from .choices import (
    ATTENTION,
    COMPILE,
    DEQUANT_DTYPES,
    DTYPES,
    FP8_MATMUL,
    LAYOUTS,
    MAX_CFG_DEGREE,
    MAX_DEGREE,
    MAX_PP_PATCHES,
    MAX_PP_WARMUP,
    WEIGHTS,
)
from .families import AUTO, family_choices
from .load_request import LoadRequest

ALL_DEVICES = ("", "all", "all gpus")  # what "every visible GPU" may be written as


@dataclasses.dataclass(frozen=True)
class LoadChoices:
    """What a user picks for a load (the loader node's inputs): ``model`` is a built-in tiny model's name or a
    path; ``vae`` a VAE file's path or None for the model's own; the rest the node's words and numbers."""

    model: str
    family: str = AUTO
    devices: str = "all"
    layout: str = "auto"
    ulysses: int = 1
    ring: int = 1
    cfg_parallel: int = 1
    pipefusion: int = 1
    pp_patches: int = 0  # 0: automatic
    pp_warmup: int = 1
    dtype: str = "bf16"
    attention: str = "auto"
    vae: str | None = None
    weights: str = "as file"
    dequant_dtype: str = "default"  # GGUF files: ComfyUI-GGUF's dequantisation arithmetic
    expert_2: str | None = None  # Wan 2.2 A14B's low-noise expert file, held with ``model`` (the high-noise one)
    expert_boundary: float = 0.0  # the sigma where it takes over; 0: the family's default
    compile: str = "off"  # "blocks": compiled transformer blocks
    fp8_matmul: str = "auto"  # fp8 layers: torch._scaled_mm where the GPU has fp8 units, or "upcast"


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """A checked load: the request the runtime loads, and what the loader shows about it."""

    request: LoadRequest
    family: str
    devices: tuple[str, ...]
    layout: str  # e.g. "cfg=2 x ulysses=2"
    reason: str  # why this layout (the planner's words, or "manual layout ...")
    room_made: bool  # ComfyUI's models already left these GPUs (the planner read their free memory)


def resolve_devices(devices: str) -> list[str]:
    """ "all" -> every visible GPU; otherwise a list such as "cuda:0,cuda:1" or "cpu:2" (one entry a rank)."""
    text = (devices or "").strip()
    if text.lower() in ALL_DEVICES:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                'devices is "all" but no CUDA GPU is visible',
                "the workers run one per GPU and this process sees none (no driver, or CUDA_VISIBLE_DEVICES is empty)",
                'to try the pack on CPU write devices "cpu:2" (two CPU workers; only practical with tiny models)',
            )
        return [f"cuda:{i}" for i in range(count)]
    return parse_devices(text)


def check_devices(devices: str) -> list[str]:
    """The devices a load would use, each one this process can see (ConfigError otherwise)."""
    resolved = resolve_devices(devices)
    check_visible(resolved)
    return resolved


def devices_spec(devices: Sequence[str]) -> str:
    """The device list as the runtime takes it: "cpu:N" for CPU ranks, else "cuda:0,cuda:1"."""
    return f"cpu:{len(devices)}" if all(d == "cpu" for d in devices) else ",".join(devices)


def manual_layout(
    devices: Sequence[str], ulysses: int, ring: int, cfg: int, pipefusion: int, pp_patches: int = 0
) -> ParallelConfig:
    """The ParallelConfig of a manual layout, checked against the devices (ConfigError otherwise)."""
    for name, value, high in (
        ("ulysses", ulysses, MAX_DEGREE),
        ("ring", ring, MAX_DEGREE),
        ("cfg_parallel", cfg, MAX_CFG_DEGREE),
        ("pipefusion", pipefusion, MAX_DEGREE),
    ):
        input_checks.whole_number(name, value, 1, high, "a layout degree is a whole number of ranks")
    config = ParallelConfig(cfg=cfg, pp=pipefusion, ring=ring, ulysses=ulysses)
    validate_layout(devices, config)
    if pp_patches and pipefusion > 1 and pp_patches < pipefusion:
        raise ConfigError(
            f"pp_patches {pp_patches} is fewer than the {pipefusion} PipeFusion stages",
            "every stage works on a different patch at a time",
            f"use pp_patches 0 (automatic) or at least {pipefusion}",
        )
    return config


def _check_choices(choices: LoadChoices) -> str:
    """Every word of ``choices`` one of its list, every number within its limits; returns the storage."""
    input_checks.choice("family", choices.family, family_choices())
    input_checks.choice("layout", choices.layout, LAYOUTS)
    input_checks.choice("dtype", choices.dtype, DTYPES)
    input_checks.choice("attention", choices.attention, ATTENTION)
    input_checks.choice("weights", choices.weights, tuple(WEIGHTS))
    input_checks.choice("dequant_dtype", choices.dequant_dtype, DEQUANT_DTYPES)
    input_checks.choice("compile", choices.compile, COMPILE)
    input_checks.choice("fp8_matmul", choices.fp8_matmul, FP8_MATMUL)
    why = "PipeFusion's patches and warmup steps are whole numbers"
    input_checks.whole_number("pp_patches", choices.pp_patches, 0, MAX_PP_PATCHES, why)
    input_checks.whole_number("pp_warmup", choices.pp_warmup, 0, MAX_PP_WARMUP, why)
    return WEIGHTS[choices.weights]


def both_experts(info: ModelInfo) -> ModelInfo:
    """The planner's facts of a model held twice (two experts of one shape)."""
    return dataclasses.replace(
        info,
        weight_bytes=2 * info.weight_bytes,
        block_bytes=tuple(2 * b for b in info.block_bytes),
        embed_bytes=2 * info.embed_bytes,
        final_bytes=2 * info.final_bytes,
    )


def plan_load(choices: LoadChoices, make_room: Callable[[Sequence[str]], None]) -> LoadPlan:
    """The load ``choices`` ask for. A manual layout is checked against the devices; the automatic one is
    planned from the machine (``make_room(devices)`` is called first: ComfyUI's own models leave the GPUs
    whose free memory the planner reads). The files (model, VAE) and the family are checked before that."""
    from ..models.model_info import model_info_from_path
    from ..parallel.layout import LayoutRequest, plan_layout, weights_held
    from ..parallel.machine import MachineInfo
    from ..parallel.stages import plan_stages
    from .api import resolve_model_path

    storage = _check_choices(choices)
    if choices.vae is not None:
        from ..vae.file import inspect_vae_file

        inspect_vae_file(choices.vae)  # a wrong file fails here, before any memory is freed or worker started
    chosen = None if choices.family == AUTO else choices.family
    info = model_info_from_path(resolve_model_path(choices.model), chosen, choices.dtype, storage)
    if choices.expert_2 is not None:
        info = both_experts(info)  # every rank holds both experts
    devices = check_devices(choices.devices)
    patches, stage_weights = (choices.pp_patches or None), None
    manual = choices.layout == "manual"
    if manual:
        config = manual_layout(
            devices, choices.ulysses, choices.ring, choices.cfg_parallel, choices.pipefusion, choices.pp_patches
        )
        held = (
            info.stage_bytes(plan_stages(info.num_layers, config.pp).counts) if config.pp > 1 else [info.weight_bytes]
        )
        reason = f"manual layout {config.describe()}; {weights_held(info, held)}"
    else:
        make_room(devices)
        plan = plan_layout(MachineInfo.detect(devices_spec(devices)), info, LayoutRequest())
        config, devices, stage_weights, reason = plan.config, list(plan.devices), plan.pp_stage_weights, plan.reason
        patches = patches or plan.pp_patches
    request = LoadRequest(
        model=choices.model,
        family=info.family,
        devices=devices_spec(devices),
        layout=config,
        pp_patches=patches if config.pp > 1 else None,
        pp_warmup=choices.pp_warmup,
        pp_stage_weights=stage_weights if config.pp > 1 else None,
        dtype=choices.dtype,
        attention=choices.attention,
        vae=choices.vae,
        storage=storage,
        dequant_dtype=choices.dequant_dtype,
        expert_2=choices.expert_2,
        expert_boundary=choices.expert_boundary if choices.expert_2 is not None and choices.expert_boundary else None,
        compile=choices.compile,
        fp8_matmul=choices.fp8_matmul,
    )
    return LoadPlan(request, info.family, tuple(devices), config.describe(), reason, room_made=not manual)
