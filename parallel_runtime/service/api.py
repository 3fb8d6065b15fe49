"""Host-side API: load a model into a warm worker pool, encode text, sample, decode.

This is what the ComfyUI nodes and the CLI call; it knows nothing about ComfyUI.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..denoise.caching.specs import BlockCacheSpec, Caches, StepCacheSpec
from ..denoise.entries import Branch, as_branch, concat_conditioning
from ..denoise.settings import SamplingSettings
from ..errors import ConfigError, PoolRestarted, RuntimeTimeout
from ..models.base import Conditioning
from ..models.builtin import BUILTIN_MODELS, builtin_model_path
from ..models.lora.keymap import ModelKeys
from ..models.sampling_spec import ModelSamplingSpec
from ..parallel.config import ParallelConfig, parse_devices
from ..runtime.builtin_jobs import info as worker_info
from ..runtime.futures import EventCallback
from ..runtime.jobs import Job
from ..runtime.pool import WorkerPool
from ..runtime.pools import PoolRegistry
from . import input_checks
from .controlnets import ModelPatch, check_controls, with_model_patches
from .host_checks import check_load_request, check_pipefusion_request, host_geometry, text_encoder_files
from .image_size import FittedSize, fit_image_size
from .load_job import load_model
from .load_request import LoadRequest
from .lora import LoraChecks, LoraSpec, stack_entries
from .memory_checks import check_sampling_memory, free_for_torch
from .model_jobs import decode, encode_text, encode_text_file, generate
from .sampling_checks import (
    check_branches_for_layout,
    check_caches,
    check_conditioning_fits,
    check_latent_size,
    check_regions,
    check_sampler_for_layout,
    check_sampling_args,
    runs_negative,
)

LOAD_CANCEL_GRACE_S = 2.0  # a cancelled load that has not stopped by then is abandoned (nothing is lost)


def resolve_model_path(model: str) -> Path:
    """A diffusers folder or a single transformer file for ``model`` (the shipped trained tiny model, or
    a random-weight one built on first use)."""
    if model in BUILTIN_MODELS:
        return builtin_model_path(model)
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(
            f"model {model!r} not found",
            "the loader reads diffusers folders (with model_index.json) from disk; nothing is downloaded",
            f"pass an existing folder, or one of the built-in tiny models {', '.join(BUILTIN_MODELS)}",
        )
    if path.is_file():
        from ..models.single_file import existing_model_file

        return existing_model_file(path)
    if path.is_dir() and not (path / "model_index.json").exists():
        raise ConfigError(
            f"{path} has no model_index.json",
            "a diffusers pipeline folder lists its components in model_index.json",
            "point at the pipeline's top folder (the one containing model_index.json)",
        )
    return path


class ParallelModel:
    """A model loaded in a warm worker pool (ComfyUI's PARALLEL_MODEL).

    ``with_model_sampling`` gives a view on the same pool that samples with another model sampling
    (what ComfyUI's ModelSampling* nodes do to a MODEL); ``with_cache`` one that samples through a step
    cache (EasyCache / LazyCache) or the block cache."""

    def __init__(
        self,
        request: LoadRequest,
        path: Path,
        pool: WorkerPool,
        info: dict[str, Any],
        reason: str,
        generation: int,
        acquire: Callable[[], WorkerPool] | None = None,
    ):
        self.request, self.path, self.info = request, path, info
        self.layout_reason = reason
        self.model_sampling_override: ModelSamplingSpec | None = None
        self._lock = threading.Lock()  # one job at a time per model (shared by its views)
        self._loaded = _LoadedIn(pool, generation, acquire)  # where the model is loaded (shared by its views)
        self.loras: tuple[LoraSpec, ...] = ()  # the LoRA stack this view's jobs carry
        self.caches = Caches()  # Parallel EasyCache / LazyCache and Parallel Block Cache
        self.model_patches: tuple[ModelPatch, ...] = ()  # DiffSynth ControlNet patches (controlnets.patched_model)

    @property
    def pool(self) -> WorkerPool:
        """The worker pool holding this model (another one after its pool was closed and it reloaded)."""
        return self._loaded.pool

    def with_model_sampling(self, spec: ModelSamplingSpec) -> ParallelModel:
        """This model (same pool, nothing reloaded) sampling with ``spec`` instead of its default."""
        if not isinstance(spec, ModelSamplingSpec):
            raise ConfigError(
                f"with_model_sampling got {type(spec).__name__}",
                "a model sampling is described by a ModelSamplingSpec",
                "build one with denoise.model_sampling_flux_node / _sd3_node / _auraflow_node",
            )
        view = copy.copy(self)  # shares request, pool, info and the job lock
        view.model_sampling_override = spec
        return view

    def with_cache(self, spec: StepCacheSpec | BlockCacheSpec) -> ParallelModel:
        """This model (same pool) sampling through ``spec``, which replaces the view's cache of its kind."""
        view = copy.copy(self)
        view.caches = self.caches.plus(spec)
        return view

    @property
    def model_sampling(self) -> ModelSamplingSpec:
        """The model sampling in force: a ModelSampling node's, else the file's default (ComfyUI's)."""
        return self.model_sampling_override or self.info["model_sampling"]

    def with_loras(self, *specs: LoraSpec) -> ParallelModel:
        """This model with ``specs`` added to its LoRA stack: a view on the same warm pool (same lock);
        its jobs bring the workers' weights to the stack first (patching in place, never reloading).
        Each spec is checked first (service.lora.LoraChecks: finite strengths within ComfyUI's range, a
        file that patches this model): ConfigError otherwise."""
        for spec in specs:
            self._loaded.lora_checks.check(spec, self.lora_keys)
        view = copy.copy(self)
        view.loras = self.loras + tuple(specs)
        return view

    @property
    def lora_checks(self) -> LoraChecks:
        """The checks ``with_loras`` runs on a LoRA for this model (the LoRA node runs them too)."""
        return self._loaded.lora_checks

    @property
    def lora_keys(self) -> ModelKeys:
        """What a LoRA can patch in this model (tensor names and shapes, from the workers)."""
        return self.info["lora_keys"]

    # -- properties the nodes show/check -----------------------------------------------------------
    @property
    def family(self) -> str:
        return self.info["family"]

    @property
    def config(self) -> ParallelConfig:
        return self.pool.config

    @property
    def latent_channels(self) -> int:
        return self.info["latent_channels"]

    @property
    def spatial_factor(self) -> int:
        return self.info["spatial_factor"]

    @property
    def latent_frame_axis(self) -> bool:
        """ComfyUI's LATENT of this image family carries a frame axis of 1 ([B, C, 1, H, W], Qwen-Image)."""
        return bool(self.info.get("latent_frame_axis", False))

    @property
    def latent_dims(self) -> int:
        """2 for image models ([B,C,H,W] latents), 3 for video models ([B,C,T,H,W])."""
        return self.info.get("latent_dims", 2)

    @property
    def temporal_factor(self) -> int:
        """Video frames per latent frame (4 for Wan; the first latent frame is one video frame)."""
        return self.info.get("temporal_factor", 1)

    @property
    def patch_pixels(self) -> int:
        """Image pixels per token along a side (width and height must be multiples of it)."""
        return self.spatial_factor * self.info.get("patch_size", 2)

    def expected_conditioning(self) -> dict[str, int | None]:
        return {
            "embed_dim": self.info["embed_dim"],
            "pooled_dim": self.info["pooled_dim"],
            "image_dim": self.info.get("image_dim"),  # CLIP-vision states (Wan 2.1 I2V), else None
            "latent_channels": self.info.get("latent_channels"),  # what a reference image's latent must have
            "in_channels": self.info.get("in_channels"),  # the transformer's input features (FLUX.1 Fill: 384)
            **{k: self.info.get(k) for k in ("vace_in_channels", "ref_conv_channels")},  # Wan VACE / ref_image, or None
        }

    def check_latent_size(self, height: int, width: int) -> None:
        """A ConfigError unless ``height`` x ``width`` latent pixels suit this model and layout (patches, bands)."""
        check_latent_size(self.info, self.config, height, width)

    def describe(self) -> str:
        return (
            f"{self.family} on {','.join(self.pool.devices)} ({self.config.describe()}, {self.request.dtype}): "
            f"{self.layout_reason}"
        )

    # -- jobs --------------------------------------------------------------------------------------
    def _run(self, job: Job, *args: Any, on_event: EventCallback | None = None, should_cancel=None, **kwargs: Any):
        with self._lock:
            for attempt in (1, 2):
                generation = self._ensure_loaded(should_cancel)
                try:
                    fut = self.pool.submit(job, *args, on_event=on_event, generation=generation, **kwargs)
                except PoolRestarted:  # the workers were replaced between the load and this job
                    if attempt == 2:
                        raise
                    continue
                return fut.wait(should_cancel=should_cancel)

    def _ensure_loaded(self, should_cancel=None) -> int:
        """The workers' generation, with this model loaded in them: workers restarted after a death,
        a hang or an abort have lost it, so it is loaded again first. What a view adds (its LoRA
        stack, its model sampling) travels with each job, so the job itself re-applies it."""
        loaded = self._loaded
        if loaded.pool.closed and loaded.acquire is not None:
            # Unloaded (by this model or another on the same pool), evicted, or replaced by another
            # model on the same GPUs: the pool for this model's key, started again, gets it back.
            loaded.pool, loaded.generation = loaded.acquire(), 0
        generation = self.pool.ensure_started()
        if generation != loaded.generation:
            self.info.update(_load_into(self.pool, self.path, self.request, generation, should_cancel))
            self._loaded.generation = generation
        return generation

    run_job = _run  # another service module's job (e.g. start_image_job) on this model's workers, model loaded

    def encode_text(
        self,
        prompt: str | list[str],
        text_encoder: tuple[str, str | None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        text_encoder_2: tuple[str, str | None] | None = None,
        text_encoder_3: tuple[str, str | None] | None = None,
        text_encoder_4: tuple[str, str | None] | None = None,
        vision: dict[str, Any] | None = None,
    ) -> Conditioning:
        """Conditioning of ``prompt`` with the model's own text encoders, or with text-encoder files ``text_encoder``
        .. ``_4`` (any order), each (file, tokenizer folder or None); ``vision``: an image's tokens (files only)."""
        prompts, further = input_checks.prompts(prompt), (text_encoder_3, text_encoder_4)
        files = text_encoder_files(self.family, text_encoder, text_encoder_2, further, vision, model_file=self.path)
        if files is not None:
            options = {"more": files[1:], "vision": vision, "should_cancel": should_cancel}
            return concat_conditioning(*self._run(encode_text_file, *files[0], prompts, **options))
        conds = self._run(encode_text, prompts, loras=stack_entries(self.loras), should_cancel=should_cancel)
        return concat_conditioning(*conds)

    def encode_edit_text(self, prompt, text_encoder, images: list, mode: str = "edit_plus", should_cancel=None):
        """Conditioning of a Qwen-Image-Edit prompt with ComfyUI IMAGEs in it (``service.edit_text_job``)."""
        from .edit_text_job import check_edit_text_request, encode_edit_text_file

        path, tokenizer = check_edit_text_request(self.family, text_encoder, list(images), mode)
        job = (encode_edit_text_file, path, tokenizer, input_checks.prompts(prompt), list(images), mode)
        return concat_conditioning(*self._run(*job, should_cancel=should_cancel))

    def sample(
        self,
        positive: Conditioning | Branch,
        negative: Conditioning | Branch | None,
        latent: torch.Tensor | None,
        width: int,
        height: int,
        batch_size: int = 1,
        seed: int = 0,
        steps: int = 20,
        cfg: float = 1.0,
        sampler_name: str = "euler",
        scheduler: str = "simple",
        denoise: float = 1.0,
        sigmas: torch.Tensor | None = None,
        guidance: float | None = None,
        batch_index: list[int] | tuple[int, ...] | None = None,
        on_event: Callable[[int, str, Any], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        noise_mask: torch.Tensor | None = None,
        advanced: dict[str, Any] | None = None,
        eta: float | None = None,
        s_noise: float | None = None,
    ) -> torch.Tensor:
        """KSampler semantics on a raw VAE latent (zeros of the size when ``latent`` is None; a video
        model needs its [B,C,T,H,W] latent; ``width`` / ``height`` are read only then).

        ``positive`` / ``negative``: a Conditioning, or several ``CondEntry`` (ComfyUI's CONDITIONING
        entries with their guidance, strength and timestep range). ``guidance``: Flux guidance of
        entries without their own (None: 3.5). ``batch_index``: the LATENT's (noise draw per item).
        ``denoise`` 0 returns the latent unchanged, as KSampler does. ``noise_mask``: the LATENT's
        (Wan22ImageToVideoLatent). ``advanced``: KSamplerAdvanced's add_noise / start_at_step /
        end_at_step / return_with_leftover_noise (as SamplingSettings fields). ``eta`` / ``s_noise``: a
        ComfyUI SAMPLER's noise options, for the samplers that have them (None: ComfyUI's default)."""
        values = input_checks.sampling_values(
            width=width,
            height=height,
            batch_size=batch_size,
            seed=seed,
            steps=steps,
            cfg=cfg,
            denoise=denoise,
            guidance=guidance,
            sigmas=sigmas,
            latent=latent,
        )
        input_checks.conditioning("positive", positive, required=True)
        input_checks.conditioning("negative", negative, required=False)
        input_checks.finite_tensor("noise mask", noise_mask)
        steps, seed, denoise = values["steps"], values["seed"], values["denoise"]
        check_sampling_args(sampler_name, scheduler, steps, denoise, eta, s_noise)
        check_sampler_for_layout(self.config, sampler_name)
        if latent is None and self.latent_dims == 3:
            raise ConfigError(
                f"no latent given to the {self.family} video model",
                "a video latent also needs a frame count, which width and height do not give",
                "pass a [batch, channels, frames, height, width] latent (Parallel Empty Latent with length, "
                "EmptyHunyuanLatentVideo, WanImageToVideo)",
            )
        f = self.spatial_factor
        if latent is None:  # a size the VAE cannot make is rounded down, with a warning (image_size.py)
            size = fit_image_size(values["width"], values["height"], f, self.family).announce()
            shape = (batch_size, self.latent_channels, size.height // f, size.width // f)  # made once checked
        else:
            latent = input_checks.model_latent(
                latent, self.family, self.latent_channels, self.latent_dims, self.latent_frame_axis
            )
            shape = tuple(latent.shape)
        if noise_mask is not None:
            input_checks.noise_mask(noise_mask, shape)
        positive_branch, negative_branch = as_branch(positive), as_branch(negative)
        if sigmas is None and denoise <= 0.0:  # KSampler: no sigmas, the input latent comes back
            return torch.zeros(shape) if latent is None else latent.float().clone()
        self.check_latent_size(shape[-2], shape[-1])
        positive_branch, negative_branch = with_model_patches(self, shape, positive_branch, negative_branch)
        check_controls(
            self.family, self.latent_channels, self.config, shape, positive_branch, negative_branch, caches=self.caches
        )
        check_branches_for_layout(self.config, cfg, positive_branch, negative_branch, sampler_name, self.caches.block)
        expected, negative_runs = self.expected_conditioning(), runs_negative(cfg, negative_branch, sampler_name)
        check_conditioning_fits(expected, positive_branch, shape[0], "positive", self.family)
        if negative_runs:
            check_conditioning_fits(expected, negative_branch, shape[0], "negative", self.family)
        check_caches(self.info, self.config, self.caches.step, self.caches.block, sampler_name)
        caches = self.caches.step is not None or self.caches.block is not None
        patch = int(self.info.get("patch_size", 2))
        check_regions(shape, positive_branch, negative_branch, caches, self.config, patch)
        self._check_memory(shape, positive_branch, negative_branch if negative_runs else None)
        latent = torch.zeros(shape) if latent is None else latent
        settings = SamplingSettings(
            seed,
            steps,
            cfg,
            sampler_name,
            scheduler,
            denoise,
            sigmas,
            guidance,
            batch_index=None if batch_index is None else tuple(int(i) for i in batch_index),
            model_sampling=self.model_sampling_override,
            eta=None if eta is None else float(eta),
            s_noise=None if s_noise is None else float(s_noise),
            step_cache=self.caches.step,
            block_cache=self.caches.block,
            **(advanced or {}),
        )
        extra = self._pipefusion_kwargs()
        if noise_mask is not None:
            extra["noise_mask"] = noise_mask.float().contiguous()
        return self._run(
            generate,
            positive_branch,
            negative_branch,
            latent.float().contiguous(),
            settings,
            on_event=on_event,
            should_cancel=should_cancel,
            loras=stack_entries(self.loras),
            **extra,
        )

    def _check_memory(self, shape: tuple[int, ...], positive: Branch, negative: Branch | None) -> None:
        """ConfigError when the job's activations (memory_checks) do not fit the devices' free memory."""
        check_sampling_memory(
            self.info, self.config, self.request, self.pool.devices, shape, (positive, negative), self._gpu_free
        )

    def _gpu_free(self) -> list[int]:
        return [free_for_torch(m) for m in self._run(worker_info, result_rank="all")]

    def _pipefusion_kwargs(self) -> dict[str, Any]:
        if self.config.pp <= 1:
            return {}
        return {"patches": self.request.pp_patches, "warmup": self.request.pp_warmup}

    def decode(self, latent: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        """Raw VAE latent [B,C,H,W] -> IMAGE [B,H,W,3] in 0..1 (exact parallel decode); a video latent [B,C,T,H,W]
        -> its frames (Wan: [B*(4*T-3),H,W,3]); ``seed``: LTX-Video 0.9.1+ decode noise (None: model_jobs.decode's)."""
        latent = input_checks.decode_latent(
            latent, self.latent_channels, self.family, self.latent_dims, self.latent_frame_axis
        )
        return self._run(decode, latent.float().contiguous(), seed=None if seed is None else int(seed))

    def unload(self) -> None:
        self.pool.close()

    def __repr__(self) -> str:
        loras = f", LoRAs {', '.join(s.describe() for s in self.loras)}" if self.loras else ""
        return f"ParallelModel({self.describe()}{loras})"


@dataclasses.dataclass
class _LoadedIn:
    """The pool holding the model, which generation of its workers has it loaded (0: none yet), and
    how to get this model's pool again once that one is closed (None: a closed pool stays closed)."""

    pool: WorkerPool
    generation: int
    acquire: Callable[[], WorkerPool] | None = None
    lora_checks: LoraChecks = dataclasses.field(default_factory=LoraChecks)  # what a LoRA does to this model


def default_layout(devices: list[str], request: LoadRequest) -> tuple[ParallelConfig, str]:
    if len(devices) == 1:
        return ParallelConfig(), "one device: no parallelism"
    return ParallelConfig(ulysses=len(devices)), f"Ulysses sequence parallelism over {len(devices)} devices (default)"


def check_sample_request(request: LoadRequest, width: object, height: object, **values: Any) -> FittedSize:
    """A sample's settings checked against the model's files and the layout before any worker starts
    (the CLI checks everything before it loads): ``values`` are sampling_values' (steps, seed, cfg,
    ...) plus ``sampler`` and ``scheduler``. Returns the picture size the model makes of ``width`` x
    ``height`` (rounded down to its VAE's factor; ``FittedSize.message`` says what changed)."""
    sampler, scheduler = values.pop("sampler"), values.pop("scheduler")
    checked = input_checks.sampling_values(width=width, height=height, **values)
    check_sampling_args(sampler, scheduler, checked["steps"], checked["denoise"])
    info = host_geometry(resolve_model_path(request.model))
    config = request.layout or default_layout(parse_devices(request.devices), request)[0]
    check_sampler_for_layout(config, sampler)
    f = info["spatial_factor"]
    size = fit_image_size(checked["width"], checked["height"], f, str(info.get("family", "this")))
    check_latent_size(info, config, size.height // f, size.width // f)
    return size


def _load_into(
    pool: WorkerPool, path: Path, request: LoadRequest, generation: int, should_cancel: Callable[[], bool] | None
) -> dict[str, Any]:
    """Run the load job on those workers; a cancelled load stops at its next component, or is
    abandoned after LOAD_CANCEL_GRACE_S (a half-loaded pool holds nothing worth keeping)."""
    fut = pool.submit(
        load_model, str(path), request.dtype, request.attention, generation=generation, **request.load_kwargs()
    )
    try:
        return fut.wait(should_cancel=should_cancel, timeout=request.load_timeout_s, cancel_grace_s=LOAD_CANCEL_GRACE_S)
    except RuntimeTimeout as exc:
        raise RuntimeTimeout(
            f"loading {path.name} ran past load_timeout_s={request.load_timeout_s:g} s, so the workers were "
            "restarted; raise LoadRequest.load_timeout_s if this model loads that slowly (a cold or network disk)"
        ) from exc


def load_parallel_model(
    request: LoadRequest,
    registry: PoolRegistry,
    reason: str | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> ParallelModel:
    """Start (or reuse) the pool for this model and layout, and load the model into it. Every
    setting and the model files are checked first, before any worker starts; ``should_cancel``
    (polled) stops the load."""
    path = resolve_model_path(request.model)
    devices = parse_devices(request.devices)
    config, why = (
        (request.layout, reason or "layout chosen explicitly") if request.layout else default_layout(devices, request)
    )
    opts = {} if request.threads_per_worker is None else {"threads_per_worker": request.threads_per_worker}
    check_pipefusion_request(request, config, path)
    check_load_request(request, path)
    if request.vae:
        from ..vae.file import inspect_vae_file

        inspect_vae_file(request.vae, request.vae_norm_groups)  # a bad file fails before any worker starts
    key = (request.model_key(path, config.pp), request.attention)  # what makes this model differ from another

    def acquire() -> WorkerPool:
        return registry.get(devices, config, key=key, **opts)

    pool = acquire()
    generation = pool.ensure_started()
    info = _load_into(pool, path, request, generation, should_cancel)
    return ParallelModel(request, path, pool, info, why, generation, acquire)
