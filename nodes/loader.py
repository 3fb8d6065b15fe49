"""Parallel Model Loader: pick a model, devices and a layout; start (or reuse) the worker pool."""

from __future__ import annotations

import logging
from typing import Any

from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig, parse_devices, validate_layout
from parallel_runtime.service.families import family_choices

from .bridge import ComfyBridge
from .context import ContextNode
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import TINY_MODELS, VAE_FROM_MODEL, model_choices, resolve_model, resolve_vae, vae_choices

log = logging.getLogger("dit_parallel.nodes")

CATEGORY = "DiT Parallel"
FAMILIES = family_choices()
DTYPES = ("bf16", "fp16", "fp32")
ATTENTION = ("auto", "sdpa", "flash")
WEIGHTS = {"as file": "auto", "fp8_e4m3fn": "fp8_e4m3fn", "convert to dtype": "compute"}  # node choice -> storage
DEQUANT_DTYPES = ("default", "target", "float32", "float16", "bfloat16")  # UnetLoaderGGUFAdvanced's choices
LAYOUTS = ("auto", "manual")
# INPUT_TYPES hands every choice list to ComfyUI as a list: it validates a combo's value only then.
MAX_DEGREE = 64


def _degree(tooltip: str, maximum: int = MAX_DEGREE) -> tuple[str, dict[str, Any]]:
    return ("INT", {"default": 1, "min": 1, "max": maximum, "tooltip": tooltip + " Used when layout is manual."})


def resolve_devices(devices: str) -> list[str]:
    """ "all" -> every visible GPU; otherwise a list such as "cuda:0,cuda:1" or "cpu:2"."""
    text = (devices or "").strip()
    if text.lower() in ("", "all", "all gpus"):
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


def devices_spec(devices: list[str] | tuple[str, ...]) -> str:
    return f"cpu:{len(devices)}" if all(d == "cpu" for d in devices) else ",".join(devices)


def _check_range(name: str, value: Any, low: int, high: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"{name} is {value!r}; it must be a whole number from {low} to {high}"
    return None


class ParallelModelLoader(ContextNode):
    """Loads a Flux / SD3 / PixArt / Qwen-Image / FLUX.2 / Wan pipeline onto worker processes, one per device."""

    DESCRIPTION = (
        "Starts one worker process per device and loads the model split across them. The layout (how the work "
        "is split) is chosen automatically from the GPUs and their links, or set by hand."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = (PARALLEL_MODEL,)
    RETURN_NAMES = ("parallel_model",)
    OUTPUT_TOOLTIPS = ("The model running on the worker pool; connect it to the other DiT Parallel nodes.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (
                    model_choices(ComfyBridge()),
                    {
                        "tooltip": "A diffusers folder (models/diffusers), a single transformer .safetensors or "
                        "GGUF (.gguf, ComfyUI-GGUF's) file (models/diffusion_models, models/unet), or a tiny random "
                        "model for trying the pack without downloads."
                    },
                ),
                "family": (
                    list(FAMILIES),
                    {"default": "auto", "tooltip": "Model family; 'auto' detects it from the files."},
                ),
                "devices": (
                    "STRING",
                    {
                        "default": "all",
                        "tooltip": '"all" (every visible GPU), a list such as "cuda:0,cuda:1", or "cpu:2" for CPU workers.',
                    },
                ),
                "layout": (
                    list(LAYOUTS),
                    {
                        "default": "auto",
                        "tooltip": "auto: chosen from GPU count, NVLink/P2P links, free memory, heads and resolution. "
                        "manual: the degrees below (their product must equal the number of devices).",
                    },
                ),
                "ulysses": _degree("Ulysses sequence parallel degree (all-to-all over heads; wants NVLink/P2P)."),
                "ring": _degree("Ring attention degree (K/V passed around; for the rest of the sequence split)."),
                "cfg_parallel": _degree("CFG parallel degree: 2 runs cond and uncond on different devices.", 2),
                "pipefusion": _degree("PipeFusion degree: transformer layers split into this many stages."),
                "pp_patches": (
                    "INT",
                    {"default": 0, "min": 0, "max": 256, "tooltip": "PipeFusion patches (row bands); 0 = automatic."},
                ),
                "pp_warmup": (
                    "INT",
                    {"default": 1, "min": 0, "max": 100, "tooltip": "PipeFusion steps run on the whole image first."},
                ),
                "dtype": (list(DTYPES), {"default": "bf16", "tooltip": "Weight and compute precision."}),
                "attention": (
                    list(ATTENTION),
                    {"default": "auto", "tooltip": "Attention kernel: flash-attn when available, else SDPA."},
                ),
            },
            "optional": {
                "vae": (
                    vae_choices(ComfyBridge()),
                    {
                        "default": VAE_FROM_MODEL,
                        "tooltip": "The VAE that Parallel VAE Decode uses: the model's own (a diffusers folder's, or "
                        "a full checkpoint's), or a file from models/vae, e.g. ae.safetensors for a Flux "
                        "transformer file, which carries none.",
                    },
                ),
                "weights": (
                    list(WEIGHTS),
                    {
                        "default": "as file",
                        "tooltip": "How the transformer's Linear weights are held. as file: an fp8 file (e.g. "
                        "qwen_image_fp8_e4m3fn.safetensors) stays fp8 on the devices, each layer upcast to dtype "
                        "when it runs; fp8_e4m3fn: also store a bf16 model's blocks in fp8 (half the memory); "
                        "convert to dtype: upcast fp8 files to dtype once, at load. A GGUF file's weights stay "
                        "in their quantised blocks with 'as file' (dequantised per layer as it runs) and are "
                        "dequantised once, at load, with 'convert to dtype'.",
                    },
                ),
                "dequant_dtype": (
                    DEQUANT_DTYPES,
                    {
                        "default": "default",
                        "tooltip": "GGUF files only: the arithmetic of dequantisation, as ComfyUI-GGUF's Unet Loader "
                        "(GGUF/Advanced) offers it. default: block scales times quantised values in float16, then "
                        "cast to dtype (what Unet Loader (GGUF) does); target: in dtype; float32 / float16 / "
                        "bfloat16: in that type.",
                    },
                ),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, devices: str) -> bool | str:
        """Reject devices that cannot work before the prompt runs. Only ``devices`` is named here:
        ComfyUI reports a VALIDATE_INPUTS problem once per named input (and marks each red), and
        range-checks the inputs not named here itself. A manual layout that does not fit the devices
        is refused by ``load`` before any worker starts."""
        try:
            devs = resolve_devices(devices)
            validate_layout(devs, ParallelConfig(ulysses=len(devs)))  # every GPU listed is visible
        except ConfigError as exc:
            return str(exc)
        return True

    def load(
        self,
        model: str,
        family: str,
        devices: str,
        layout: str,
        ulysses: int,
        ring: int,
        cfg_parallel: int,
        pipefusion: int,
        pp_patches: int,
        pp_warmup: int,
        dtype: str,
        attention: str,
        vae: str = VAE_FROM_MODEL,
        weights: str = "as file",
        dequant_dtype: str = "default",
    ) -> dict[str, Any]:
        from parallel_runtime.models.model_info import model_info_from_path
        from parallel_runtime.parallel.layout import LayoutRequest, plan_layout, weights_held
        from parallel_runtime.parallel.machine import MachineInfo
        from parallel_runtime.parallel.stages import plan_stages

        ctx = self.context
        target = resolve_model(model, ctx.bridge)
        vae_path = resolve_vae(vae, ctx.bridge)
        if vae_path is not None:
            from parallel_runtime.vae.file import inspect_vae_file

            inspect_vae_file(vae_path)  # a wrong file fails here, before any memory is freed or worker started
        chosen = None if family == "auto" else family
        storage = WEIGHTS.get(weights)
        if storage is None:
            raise ConfigError(
                f"weights {weights!r}",
                "the loader keeps, stores or converts fp8 weights",
                f"use one of {list(WEIGHTS)}",
            )
        if dequant_dtype not in DEQUANT_DTYPES:
            raise ConfigError(
                f"dequant_dtype {dequant_dtype!r}",
                "GGUF blocks are dequantised in one of ComfyUI-GGUF's arithmetics",
                f"use one of {list(DEQUANT_DTYPES)}",
            )
        info = model_info_from_path(_local_path(target), family=chosen, dtype=dtype, storage=storage)
        if chosen is not None and info.family != chosen:
            raise ConfigError(
                f"{model} is a {info.family} model but family {chosen!r} was chosen",
                "the family decides which adapter splits the model; a wrong one cannot load it",
                f"set family to {info.family!r} or 'auto'",
            )
        devs = resolve_devices(devices)
        patches, stage_weights = (pp_patches or None), None
        if layout == "manual":
            config = manual_layout(devs, ulysses, ring, cfg_parallel, pipefusion, pp_patches)
            held = (
                info.stage_bytes(plan_stages(info.num_layers, config.pp).counts)
                if config.pp > 1
                else [info.weight_bytes]
            )
            reason = f"manual layout {config.describe()}; {weights_held(info, held)}"
        else:
            # The plan reads free GPU memory: ComfyUI's own models must be off those GPUs first.
            ctx.bridge.free_memory_for(devs)
            plan = plan_layout(MachineInfo.detect(devices_spec(devs)), info, LayoutRequest())
            config, devs, stage_weights, reason = plan.config, list(plan.devices), plan.pp_stage_weights, plan.reason
            patches = patches or plan.pp_patches
        request = build_request(
            model=target,
            family=info.family,
            devices=devices_spec(devs),
            layout=config,
            pp_patches=patches if config.pp > 1 else None,
            pp_warmup=pp_warmup,
            pp_stage_weights=stage_weights if config.pp > 1 else None,
            dtype=dtype,
            attention=attention,
            vae=vae_path,
            storage=storage,
            dequant_dtype=dequant_dtype,
        )
        handle = ParallelModelHandle(request, ctx, model, info.family, tuple(devs), config.describe(), reason)
        handle.model(room_made=layout != "manual")  # start the workers now, so load errors show on this node
        text = f"{model} ({info.family}) on {devices_spec(devs)}: {reason}"
        log.info("dit-parallel layout: %s", text)
        return {"ui": {"text": [text]}, "result": (handle,)}


def manual_layout(
    devices: list[str], ulysses: int, ring: int, cfg: int, pipefusion: int, pp_patches: int
) -> ParallelConfig:
    """The ParallelConfig of a manual layout, checked against the devices (ConfigError otherwise)."""
    for name, value, low, high in (
        ("ulysses", ulysses, 1, MAX_DEGREE),
        ("ring", ring, 1, MAX_DEGREE),
        ("cfg_parallel", cfg, 1, 2),
        ("pipefusion", pipefusion, 1, MAX_DEGREE),
    ):
        problem = _check_range(name, value, low, high)
        if problem:
            raise ConfigError(problem, "a layout degree is a whole number of ranks", f"set {name} within that range")
    config = ParallelConfig(cfg=cfg, pp=pipefusion, ring=ring, ulysses=ulysses)
    validate_layout(devices, config)
    if pp_patches and pipefusion > 1 and pp_patches < pipefusion:
        raise ConfigError(
            f"pp_patches {pp_patches} is fewer than the {pipefusion} PipeFusion stages",
            "every stage works on a different patch at a time",
            f"use pp_patches 0 (automatic) or at least {pipefusion}",
        )
    return config


def _local_path(target: str) -> str:
    """A built-in model name -> its folder (shipped, or built once by the pack's dit_devtools); paths unchanged."""
    if target in TINY_MODELS:
        from parallel_runtime.models.builtin import builtin_model_path

        return str(builtin_model_path(target))
    return target


def build_request(**fields: Any) -> Any:
    """A ``LoadRequest`` with the fields this runtime version has. PipeFusion settings are only
    dropped when they are unused; a layout that needs them fails with a clear error instead."""
    import dataclasses

    from parallel_runtime.service.api import LoadRequest

    known = {f.name for f in dataclasses.fields(LoadRequest)}
    layout = fields.get("layout")
    if layout is not None and layout.pp > 1 and "pp_patches" not in known:
        raise ConfigError(
            f"the layout {layout.describe()} uses PipeFusion, which this runtime version does not provide yet",
            "parallel_runtime.service.api.LoadRequest has no PipeFusion settings (pp_patches, pp_warmup, pp_stage_weights)",
            "choose a manual layout without pipefusion (ulysses / ring / cfg_parallel), or update dit-parallel",
        )
    return LoadRequest(**{k: v for k, v in fields.items() if k in known})
