"""Worker-side jobs that load and unload a model; the loaded pipeline lives in ``ctx.state``
between jobs (the point of a warm pool). Every job runs on every rank; collectives inside happen
in the same order everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..attention.kernels import describe_choice
from ..errors import ConfigError, PeerFailed
from ..models.base import ModelAdapter
from ..models.compiled_blocks import set_compiled_blocks
from ..models.families.registry import family
from ..models.fp8_matmul import apply_fp8_matmul
from ..models.loading import PipelineComponents, has_second_expert, load_pipeline_components, read_model_index
from ..parallel.collectives import agree_any
from ..runtime.jobs import JobContext
from .load_request import model_key
from .lora_state import lora_keys

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TEXT_RANK = 0  # the rank that holds the text encoders


@dataclasses.dataclass
class LoadedModel:
    key: tuple
    components: PipelineComponents
    adapter: ModelAdapter
    attention: str
    stages: Any = None  # PipeFusion StagePlan when the mesh has pp > 1 (this rank holds one stage)
    stage_weights: Any = None  # what this rank's stage loaded (pipefusion.stage_loading.StageWeights)
    lora: Any = None  # models.lora.patcher.LoraPatcher once a LoRA touched this model (service.lora_state)
    expert_2: tuple[ModelAdapter, float] | None = None  # second expert and its boundary sigma (Wan 2.2 A14B)
    lora_2: Any = None  # the second expert's LoraPatcher (it takes the same stack as the first)
    devices: tuple[str, ...] = ()  # every rank's device, in rank order (where a text-encoder file may go)


def torch_dtype(name: str) -> torch.dtype:
    """ "fp32" / "bf16" / "fp16" as a torch dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(
            f"unknown dtype {name!r}",
            "weights are loaded in one of the supported precisions",
            f"use one of {sorted(DTYPES)}",
        ) from None


def loaded_model(ctx: JobContext) -> LoadedModel:
    """The model the load_model job put in this worker's state (a clear error when none is loaded)."""
    model = ctx.state.get("model")
    if model is None:
        raise ConfigError(
            "no model is loaded in this pool",
            "generate/encode/decode jobs run on the model loaded by the load_model job",
            "load a model first (ParallelModel / the loader node does this)",
        )
    return model


def load_model(
    ctx: JobContext,
    path: str,
    dtype: str = "fp32",
    attention: str = "auto",
    pp_stage_weights: tuple[float, ...] | None = None,
    vae_path: str | None = None,
    vae_norm_groups: int = 32,
    storage: str = "auto",
    dequant_dtype: str = "default",
    expert_2_path: str | None = None,
    boundary: float | None = None,
    compile: str = "off",
    fp8_matmul: str = "auto",
) -> dict[str, Any]:
    """Load the pipeline onto this rank's device (text encoders only on TEXT_RANK). Reuses it when
    the same model and dtype are already loaded. With pp > 1 each rank loads only its PipeFusion
    stage's blocks (``pp_stage_weights``: relative share of blocks per stage; None: equal). A single
    transformer file (``path`` is a file) loads the transformer only (:mod:`parallel_runtime.models.single_file`).
    ``storage`` says how Linear weights are held (``models.weights.WEIGHT_STORAGE``: fp8 files stay fp8
    by default, computing in ``dtype``). ``dequant_dtype``: the arithmetic a GGUF file's blocks are
    dequantised in (``models.gguf.dequant.DEQUANT_MODES``, ComfyUI-GGUF's choices). ``expert_2_path``: Wan 2.2
    A14B's low-noise expert file next to a high-noise ``path`` file, held with it (``models.expert_files``).
    ``compile="blocks"`` compiles the transformer blocks (each kind once
    per shape, kept while the pool is warm; ``models.compiled_blocks``); "off" runs them eagerly.
    ``fp8_matmul``: how fp8 layers multiply (``models.fp8_matmul``: "auto" uses torch._scaled_mm on sm89+)."""
    pp = ctx.mesh.size("pp")
    weights = tuple(pp_stage_weights) if pp > 1 and pp_stage_weights else None
    key = model_key(
        path, dtype, pp, weights, vae_path, vae_norm_groups, storage, dequant_dtype, expert_2_path, boundary
    )
    model = ctx.state.get("model")
    if model is None or model.key != key:
        ctx.state.pop("model", None)
        devices = _world_devices(ctx)  # collective: every rank takes part
        failure: Exception | None = None
        stopped = False  # this rank saw the cancel between two components
        comps = stages = stage_weights = None
        try:
            comps, stages, stage_weights = _load_transformer_and_vae(
                ctx, path, dtype, pp, weights, vae_path, vae_norm_groups, storage, dequant_dtype
            )
            if expert_2_path is not None:
                from ..models.expert_files import attach_second_expert

                if pp > 1 or not Path(path).is_file():
                    raise ConfigError(
                        "a second expert file with PipeFusion or a diffusers folder",
                        "a second expert file joins a single high-noise file, loaded whole on every rank",
                        "use Ulysses / Ring / CFG parallelism, and the high-noise expert's single file",
                    )
                comps = attach_second_expert(
                    comps, expert_2_path, ctx.device, torch_dtype(dtype), boundary, storage, dequant_dtype
                )
        except _LoadStopped:
            stopped = True
        except Exception as exc:  # noqa: BLE001 - raised below, once every rank knows
            failure = exc
        if ctx.world_size > 1 and Path(path).is_dir():
            dist.barrier()  # every rank's transformer share is in place: what the GPUs have left is known
        if comps is not None:
            try:
                _load_text_encoders(ctx, comps, path, dtype, devices)
            except _LoadStopped:
                stopped = True
            except Exception as exc:  # noqa: BLE001 - raised below, once every rank knows
                failure = exc
        # Collectives: every rank reaches them whether it finished, stopped early or failed.
        if agree_any(failure is not None):
            raise failure if failure is not None else PeerFailed("the model load failed on another rank")
        ctx.check_cancel()
        assert comps is not None and not stopped  # a stopped rank raised JobCancelled just above
        model = LoadedModel(
            key,
            comps,
            comps.adapter(),
            attention,
            stages,
            stage_weights,
            expert_2=comps.second_expert(),
            devices=tuple(devices),
        )
        ctx.state["model"] = model
    model.attention = attention
    fp8_choice = ""
    for adapter in (model.adapter, *(() if model.expert_2 is None else (model.expert_2[0],))):
        fp8_choice = apply_fp8_matmul(adapter.transformer, fp8_matmul, ctx.device, adapter.dtype)
        set_compiled_blocks(adapter, compile)
    adapter, cfg = model.adapter, model.components.transformer_config
    params = model.components.transformer.parameters()
    weight_bytes = sum(p.numel() * p.element_size() for p in params if p.device.type != "meta")
    pipefusion = None
    if model.stages is not None:
        from ..pipefusion.stage_loading import describe_stages

        pipefusion = describe_stages(ctx.mesh, model.stages, model.stage_weights)
    return {
        "pipefusion": pipefusion,
        "family": adapter.plan.family,
        "latent_channels": adapter.plan.latent_channels,
        "spatial_factor": adapter.plan.vae_scale_factor,
        "latent_frame_axis": adapter.plan.latent_frame_axis,
        "latent_dims": adapter.plan.latent_dims,
        "temporal_factor": adapter.plan.vae_temporal_factor,
        "experts": 1 if model.expert_2 is None else 2,
        "patch_size": adapter.plan.patch_size,
        "guidance_embed": adapter.plan.guidance_embed,
        "model_sampling": adapter.plan.model_sampling,  # ComfyUI's default for this file
        "pads_to_patch": adapter.plan.pads_to_patch,
        "max_grid_side": adapter.plan.max_grid_side,
        "num_heads": adapter.config_sizes(cfg).heads or None,
        "inner_dim": adapter.config_sizes(cfg).hidden or None,
        "num_blocks": adapter.num_blocks,
        "embed_dim": _embed_dim(model),
        "pooled_dim": adapter.config_sizes(cfg).pooled_dim,
        "image_dim": cfg.get("image_dim"),
        "in_channels": cfg.get("in_channels"),
        "vace_in_channels": cfg.get("vace_in_channels"),  # Wan VACE's control context (None: no VACE blocks)
        "ref_conv_channels": cfg.get("_ref_conv_in_channels"),  # Wan Fun-Control's reference image (None: no ref_conv)
        "transformer_bytes": weight_bytes,
        "compile": compile,
        "fp8_matmul": fp8_choice,
        "attention_choice": describe_choice(attention, ctx.device),
        "memory": ctx.report_memory(),
        "lora_keys": lora_keys(model) if ctx.rank == 0 else None,  # what a LoRA may patch (names and shapes)
    }


class _LoadStopped(Exception):
    """Raised between two components of a load when this rank sees its job cancelled."""


def _checkpoint(ctx: JobContext) -> None:
    """Between two loaded components: a progress point, and a local stop when cancelled (no
    collective happens while loading, so ranks may stop at different points; they agree after)."""
    ctx.progress()
    if ctx.cancel_requested():
        raise _LoadStopped


def _load_transformer_and_vae(ctx, path, dtype, pp, weights, vae_path, vae_norm_groups, storage, dequant_dtype):
    """(components, stages, stage weights) with this rank's transformer (share) and the VAE."""
    stages = stage_weights = None
    text: tuple[str, ...] = ()  # text encoders are loaded after, spread over the pool's devices
    _checkpoint(ctx)
    if Path(path).is_file() and pp > 1:  # a single-file transformer: no VAE or text encoders
        from ..pipefusion.stage_loading import load_single_file_stage

        comps, stages, stage_weights = load_single_file_stage(
            path, pp, ctx.mesh.rank("pp"), ctx.device, torch_dtype(dtype), weights, storage=storage,
            dequant_dtype=dequant_dtype,
        )  # fmt: skip
    elif Path(path).is_file():
        from ..models.single_file import load_single_file_components

        comps = load_single_file_components(
            path, ctx.device, torch_dtype(dtype), storage=storage, dequant_dtype=dequant_dtype
        )
    elif pp > 1 or storage != "auto" or _has_idle_weights(path):  # stages, weights stored other than as the
        # folder has them, or weights the adapter never runs (read tensor by tensor, those left unread)
        from ..pipefusion.stage_loading import load_pipeline_stage

        if has_second_expert(read_model_index(path)):
            raise ConfigError(
                f"{Path(path).name} has two experts (transformer and transformer_2) and the layout has PipeFusion",
                "PipeFusion stages load one transformer's blocks; a second expert would be left out",
                "use Ulysses / Ring / CFG parallelism for this model, or load each expert's file as its own "
                "model and chain two Parallel Sampler (Advanced) nodes (high noise, then low noise)",
            )
        comps, stages, stage_weights = load_pipeline_stage(
            path, pp, ctx.mesh.rank("pp"), ctx.device, torch_dtype(dtype), weights, ("vae", *text), storage
        )
        if pp == 1:
            stages = stage_weights = None
    else:
        comps = load_pipeline_components(
            path, ctx.device, torch_dtype(dtype), ("transformer", "vae", *text), lambda _: _checkpoint(ctx)
        )
    _checkpoint(ctx)
    if vae_path is not None:
        comps.vae = _vae_from_file(comps, vae_path, ctx.device, vae_norm_groups)
    elif Path(path).is_file():
        comps.vae = _embedded_vae(comps, path, ctx.device)
    if comps.vae is not None:
        comps.vae.to(torch.float32 if dtype == "fp16" else torch_dtype(dtype))
    _checkpoint(ctx)
    return comps, stages, stage_weights


def _has_idle_weights(folder: str) -> bool:
    """Whether the folder's transformer has parameters its adapter never runs (``FamilySpec.idle_modules``)."""
    from ..models.families.registry import family_of_class_name

    entry = read_model_index(folder).get("transformer")
    spec = family_of_class_name(str(entry[-1])) if isinstance(entry, (list, tuple)) and entry else None
    return spec is not None and bool(spec.idle_modules)


def _load_text_encoders(ctx, comps, path, dtype, devices) -> None:
    """The text encoders, on TEXT_RANK only, spread over the GPUs' room left after the transformer."""
    if ctx.rank == TEXT_RANK and Path(path).is_dir() and family(comps.family).text_encoding().on_workers:
        placement = text_encoder_placement(_encoder_bytes(Path(path)), devices, free_gpu_bytes(devices))
        comps.text_encoders = load_pipeline_components(
            path, placement, torch_dtype(dtype), ("text",), lambda _: _checkpoint(ctx)
        ).text_encoders
    _checkpoint(ctx)


def _vae_from_file(comps: PipelineComponents, file: str, device: torch.device, norm_groups: int) -> torch.nn.Module:
    """The VAE in ``file`` in place of the model's own. It keeps the model's latent scale and shift
    (its own VAE's, or the family's), which a VAE file does not record."""
    from ..vae.file import load_vae_file

    fmt = comps.adapter().plan.latent_format
    vae = load_vae_file(file, device, torch.float32, norm_groups)
    patch = getattr(vae.config, "patch_size", None) if getattr(vae, "bn", None) is not None else None
    latent_channels = getattr(vae.config, "latent_channels", None) or vae.config.z_dim  # z_dim: AutoencoderKLWan
    channels = latent_channels * (patch[0] * patch[1] if patch else 1)  # FLUX.2: the packed latent's
    if channels != fmt.channels:
        packed = f", {channels} packed {patch[0]}x{patch[1]}," if patch else ""
        raise ConfigError(
            f"the VAE {Path(file).name} has {latent_channels} latent channels{packed} but this "
            f"{comps.family} model makes {fmt.channels}",
            "a latent can only be decoded by the VAE family that made it",
            f"pick the {comps.family} VAE (ae.safetensors for Flux, flux2-vae.safetensors for FLUX.2), or the model's own",
        )
    if not fmt.per_channel:  # a per-channel (Wan) VAE file is loaded with its statistics already
        vae.register_to_config(scaling_factor=fmt.scale, shift_factor=fmt.shift or None)
    return vae


def _embedded_vae(comps: PipelineComponents, path: str, device: torch.device) -> torch.nn.Module | None:
    """A full checkpoint (transformer plus ``first_stage_model.*``) carries its VAE: use it."""
    from ..vae.file import inspect_vae_file

    try:
        inspect_vae_file(path)
    except ConfigError:
        return None  # a transformer-only file
    return _vae_from_file(comps, path, device, 32)


def _world_devices(ctx: JobContext) -> list[str]:
    """Every rank's device, in rank order."""
    if ctx.world_size == 1:
        return [str(ctx.device)]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, str(ctx.device))
    return out


def _encoder_bytes(path: Path) -> dict[str, int]:
    """Weight-file size of each text encoder of a diffusers folder."""
    sizes = {}
    for folder in sorted(path.glob("text_encoder*")):
        if folder.is_dir():
            sizes[folder.name] = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return sizes


def text_encoder_placement(
    encoder_bytes: dict[str, int], devices: list[str], free: dict[str, int] | None = None
) -> dict[str, Any]:
    """Spread the text encoders over the pool's distinct devices: the biggest first, each onto the
    device with the fewest encoder bytes so far (T5-XXL's ~9 GB then does not share a GPU with
    the CLIPs). They run in the TEXT_RANK process, which can address every visible GPU.

    With ``free`` (bytes free per GPU), an encoder larger than what any one GPU has left is spread by
    layers over all of them instead ({gpu: bytes it may take}): Mistral-Small's 48 GB (FLUX.2) on 24 GB
    cards, Qwen2.5-VL's 15 GB next to a Qwen-Image stage."""
    distinct = list(dict.fromkeys(devices))
    load = dict.fromkeys(distinct, 0)
    left = dict(free or {})
    placement: dict[str, Any] = {}
    for name, size in sorted(encoder_bytes.items(), key=lambda item: (-item[1], item[0])):
        device = min(distinct, key=lambda d: (load[d], distinct.index(d)))
        total = sum(left.values())
        if left and size > max(left.get(d, 0) for d in distinct) and size <= total:
            placement[name] = {d: left[d] for d in distinct if left.get(d, 0) > 0}
            left = {d: b - size * b // total for d, b in left.items()}  # each GPU takes its share of the layers
            continue
        placement[name] = device
        load[device] += size
        if device in left:
            left[device] = max(left[device] - size, 0)
    return placement


def text_file_placement(
    model: LoadedModel, encoder_path: str, beside: Sequence[str] = (), beside_bytes: int = 0
) -> Any:
    """Where a text-encoder FILE goes on TEXT_RANK: one device, or ({gpu: bytes}) spread by layers over the
    pool's GPUs when it is larger than what any one has left (its file size counts, vision tower included;
    the files read ``beside`` it, and ``beside_bytes`` more (a part read from the model's own file), go to its
    first device: they count with it, and leave that GPU's share smaller)."""
    extra = sum(Path(p).stat().st_size for p in beside) + beside_bytes
    devices = list(model.devices)
    size = Path(encoder_path).stat().st_size + extra
    where = text_encoder_placement({"file": size}, devices, free_gpu_bytes(devices))["file"]
    if isinstance(where, dict) and extra:
        first = next(iter(where))
        where = {**where, first: max(where[first] - extra, 0)}
    return where


TEXT_RESERVE = 2 * 1024**3  # left free on a GPU for activations when text encoder layers are spread


def free_gpu_bytes(devices: list[str]) -> dict[str, int]:
    """Free bytes on each distinct GPU of ``devices`` less a reserve (empty for CPU pools)."""
    out = {}
    for d in dict.fromkeys(devices):
        device = torch.device(d)
        if device.type == "cuda":
            out[d] = max(int(torch.cuda.mem_get_info(device)[0]) - TEXT_RESERVE, 0)
    return out


def _embed_dim(model: LoadedModel) -> int | None:
    return model.adapter.config_sizes(model.components.transformer_config).text_dim


def unload(ctx: JobContext) -> None:
    """Drop the loaded model and free device memory."""
    ctx.state.pop("model", None)
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
