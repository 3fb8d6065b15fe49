"""The service's face for a ComfyUI graph: one function per node, taking ComfyUI's data as the node receives it
(CONDITIONING lists, LATENT dicts, a SAMPLER, widget values) and handing back ComfyUI's data.

Every check and limit is the service's own (``input_checks``, ``sampling_checks``, ``load_plan``): the nodes
declare their inputs from the limits named here and their VALIDATE_INPUTS call the same checks. Nothing here
imports ComfyUI; ComfyUI's formats are plain lists, dicts and tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from . import input_checks
from .choices import ENABLE_DISABLE, MAX_BATCH, MAX_FRAMES, MAX_SHIFT, MAX_STEPS
from .comfy_conditioning import from_runtime, to_branch
from .families import takes_guidance

if TYPE_CHECKING:
    import torch

    from ..models.sampling_spec import ModelSamplingSpec
    from .api import ParallelModel
    from .lora import LoraSpec

EventFn = Callable[[int, str, Any], None]


def sampler_choices() -> tuple[list[str], list[str]]:
    """ComfyUI 0.3.64's sampler and scheduler names, in its order, as lists (ComfyUI validates a combo's value
    only when its options are a list)."""
    from ..sampling import SAMPLER_NAMES, SCHEDULER_NAMES

    return list(SAMPLER_NAMES), list(SCHEDULER_NAMES)


def _latent_parts(latent: object) -> tuple[torch.Tensor, torch.Tensor | None, list[int] | None]:
    """(samples, noise mask, batch index) of a ComfyUI LATENT, each on the CPU (the model checks them)."""
    import torch

    _refuse_audio(latent)
    if not isinstance(latent, Mapping) or not isinstance(latent.get("samples"), torch.Tensor):
        raise ConfigError(
            "latent_image is not a LATENT",
            "a LATENT is a dict with a 'samples' tensor",
            "connect Parallel Empty Latent, EmptySD3LatentImage, VAEEncode or another LATENT output",
        )
    mask = latent.get("noise_mask")
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise ConfigError(
            f"the LATENT's noise_mask is a {type(mask).__name__}",
            "a noise mask is a tensor of the latent's size (0 keeps the input, 1 denoises)",
            "make the latent and its mask with ComfyUI's nodes (Set Latent Noise Mask, Wan22ImageToVideoLatent)",
        )
    index = latent.get("batch_index")
    return (
        latent["samples"].float().cpu(),
        None if mask is None else mask.float().cpu(),
        None if index is None else [int(i) for i in index],
    )


def _refuse_audio(latent: object) -> None:
    """An audio LATENT (``type`` "audio") or a joint audio-video one (``samples`` a nested video + audio latent,
    not one tensor): refused, no family's audio is sampled here."""
    import torch

    samples = latent.get("samples") if isinstance(latent, Mapping) else None
    audio = isinstance(latent, Mapping) and latent.get("type") == "audio"
    nested = samples is not None and not isinstance(samples, torch.Tensor) and hasattr(samples, "tensors")
    if audio or nested:
        raise ConfigError(
            f"latent_image is {'an audio' if audio else 'a joint audio-video (nested video + audio)'} LATENT",
            "the parallel samplers denoise image and video latents only: an audio-video model runs its video "
            "stream alone here, so no audio latent is sampled alongside (README, the family's section)",
            "connect the video latent alone (an empty video latent, or Parallel Empty Latent with a length), and "
            "make the audio with ComfyUI's own nodes",
        )


def sample(
    model: ParallelModel,
    positive: Any,
    negative: Any,
    latent: Mapping[str, Any],
    *,
    seed: int,
    steps: int,
    cfg: float,
    sampler_name: str,
    scheduler: str,
    denoise: float = 1.0,
    sigmas: torch.Tensor | None = None,
    guidance: float | None = None,
    sampler: Any = None,
    advanced: dict[str, Any] | None = None,
    on_event: EventFn | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """KSampler (``advanced``: KSamplerAdvanced's add_noise / start_at_step / end_at_step /
    return_with_leftover_noise) on the model's workers: ComfyUI's CONDITIONING and LATENT in, the LATENT out
    in ComfyUI's layout for the family, with the input's other entries (batch_index, a noise mask) kept as
    KSampler keeps them. ``sampler``: a ComfyUI SAMPLER, replacing ``sampler_name`` (with its eta / s_noise);
    ``guidance``: Flux guidance of entries without their own (ignored by families without guidance)."""
    from .comfy_sampler import sampler_from_input

    samples, mask, batch_index = _latent_parts(latent)
    options: dict[str, float] = {}
    if sampler is not None:
        sampler_name, options = sampler_from_input(sampler)
    expected, family = model.expected_conditioning(), model.family
    shape = tuple(samples.shape)  # a ControlNet's hint is encoded at the latent's size
    pos = to_branch(positive, expected, family, "positive", shape)
    neg = to_branch(negative, expected, family, "negative", shape) if negative is not None else None
    h, w = samples.shape[-2:]
    f = model.spatial_factor
    kwargs: dict[str, Any] = dict(
        width=w * f,
        height=h * f,
        batch_size=samples.shape[0],
        seed=seed,
        steps=steps,
        cfg=cfg,
        sampler_name=sampler_name,
        scheduler=scheduler,
        denoise=denoise,
        sigmas=sigmas,
        guidance=float(guidance) if takes_guidance(family) and guidance is not None else None,
        batch_index=batch_index,
        on_event=on_event,
        should_cancel=should_cancel,
        **options,
    )
    if mask is not None:
        kwargs["noise_mask"] = mask
    if advanced is not None:
        kwargs["advanced"] = advanced
    out = model.sample(pos, neg, samples, **kwargs)
    result = dict(latent)  # KSampler's copy: batch_index and a noise mask stay with the latent
    result["samples"] = out.unsqueeze(2) if getattr(model, "latent_frame_axis", False) else out
    return result


def schedule_window(add_noise: str, start_at_step: int, end_at_step: int, leftover_noise: str) -> dict[str, Any]:
    """KSamplerAdvanced's words and steps as ``ParallelModel.sample``'s ``advanced``: which window of the
    schedule runs, with or without added noise, returning its leftover noise or not."""
    input_checks.choice("add_noise", add_noise, ENABLE_DISABLE)
    input_checks.choice("return_with_leftover_noise", leftover_noise, ENABLE_DISABLE)
    why = "the window's steps are steps of the whole schedule"
    return {
        "add_noise": add_noise == "enable",
        "start_at_step": input_checks.whole_number("start_at_step", start_at_step, 0, MAX_STEPS, why),
        "end_at_step": input_checks.whole_number("end_at_step", end_at_step, 0, MAX_STEPS, why),
        "return_with_leftover_noise": leftover_noise == "enable",
    }


def sampling_text(model: ParallelModel) -> str:
    """What the sampler node shows: the model sampling in force and where it comes from."""
    spec = getattr(model, "model_sampling", None)
    if spec is None:
        return "model sampling: the model's default"
    text = f"model sampling: {spec.describe()}"
    if spec.source == "the model file's default" and spec.kind in ("flux_flow", "discrete_flow"):
        text += "; a Parallel Model Sampling node before the sampler changes it"
    return text


def empty_latent(model: ParallelModel, width: int, height: int, batch_size: int, length: int = 1) -> dict[str, Any]:
    """Zeros [batch, channels, height/f, width/f] for an image model (Qwen-Image: [B, C, 1, H, W], as ComfyUI
    keeps its LATENT); [batch, channels, (length-1)/4+1, height/f, width/f] for a video model (as
    EmptyHunyuanLatentVideo / Wan22ImageToVideoLatent make them). Sizes are checked against the model."""
    import torch

    width, height = input_checks.image_size(width, height)
    batch = input_checks.whole_number("batch_size", batch_size, 1, MAX_BATCH, "a batch holds one latent per image")
    frames = input_checks.whole_number("length", length, 1, MAX_FRAMES, "length counts video frames")
    channels, f = model.latent_channels, model.spatial_factor
    if width % f or height % f:
        raise ConfigError(
            f"{width}x{height} px is not a multiple of {f} px for {model.family}",
            f"this model's VAE shrinks the image {f}x, so each side is a whole number of latent pixels",
            f"use {max(f, width // f * f)}x{max(f, height // f * f)}",
        )
    model.check_latent_size(height // f, width // f)
    if model.latent_dims == 3:
        latent_frames = (frames - 1) // model.temporal_factor + 1
        return {"samples": torch.zeros(batch, channels, latent_frames, height // f, width // f)}
    if frames != 1:
        raise ConfigError(
            f"length {frames} for the {model.family} image model",
            "length counts video frames; an image model makes one image per batch item",
            "set length to 1 (or load a video model such as Wan)",
        )
    samples = torch.zeros(batch, channels, height // f, width // f)
    if getattr(model, "latent_frame_axis", False):
        samples = samples.unsqueeze(2)
    return {"samples": samples}


def image_to_video(
    model: ParallelModel,
    positive: Any,
    negative: Any,
    vision_path: str | None,
    width: int,
    height: int,
    length: int,
    batch_size: int,
    start_image: Any = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """(positive, negative, LATENT) of a HunyuanVideo 1.5 video: an empty latent and, with ``start_image``, both
    conditionings carrying its latent (the model's own VAE) and its SigLIP states (``vision_path``; None: the
    model folder's own image encoder), made on the workers (``start_image_job``); without one, text-to-video."""
    from .comfy_conditioning import EXTRAS_OPTION
    from .start_image_job import check_start_image_request, encode_start_image

    latent = empty_latent(model, width, height, batch_size, length)
    if start_image is None:
        return positive, negative, latent
    from ..models.families.hunyuan_video15.start_image import with_start_image

    check_start_image_request(model.family, vision_path, start_image, model.path)
    start, embeds = model.run_job(encode_start_image, vision_path, start_image, int(width), int(height))

    def add(conditioning: Any) -> list[list[Any]]:
        if not isinstance(conditioning, list):
            raise ConfigError(
                f"conditioning is {type(conditioning).__name__}",
                "CONDITIONING is a list of [embeddings, options] entries",
                "connect Parallel Text Encode's output",
            )
        return [
            [c, {**o, EXTRAS_OPTION: with_start_image(o.get(EXTRAS_OPTION), start, embeds)}] for c, o in conditioning
        ]

    return add(positive), add(negative), latent


def encode(
    model: ParallelModel,
    text: str,
    text_encoder: tuple[str, str | None] | None = None,
    text_encoder_2: tuple[str, str | None] | None = None,
    text_encoder_3: tuple[str, str | None] | None = None,
    text_encoder_4: tuple[str, str | None] | None = None,
) -> list[list[Any]]:
    """ComfyUI CONDITIONING of ``text`` with the model's own text encoders, or with ``text_encoder`` (a
    text-encoder file and its tokenizer folder) and ``text_encoder_2`` .. ``_4`` (the further files of a family
    that reads several: Flux.1's CLIP-L; HiDream's T5-XXL, CLIP-L and CLIP-G beside its Llama-3.1)."""
    further = {"text_encoder_2": text_encoder_2, "text_encoder_3": text_encoder_3, "text_encoder_4": text_encoder_4}
    further = {k: v for k, v in further.items() if v is not None}
    if text_encoder is None and not further:
        cond = model.encode_text(text)
    elif not further:
        cond = model.encode_text(text, text_encoder)
    else:
        cond = model.encode_text(text, text_encoder, **further)
    return from_runtime(cond)


def encode_with_image(
    model: ParallelModel,
    text: str,
    clip_vision_output: Any,
    image_interleave: int,
    text_encoder: tuple[str, str | None] | None,
    text_encoder_2: tuple[str, str | None] | None = None,
) -> list[list[Any]]:
    """ComfyUI CONDITIONING of ``text`` with an image's vision tokens in it, as TextEncodeHunyuanVideo_ImageToVideo
    makes it: ``clip_vision_output``'s ``mm_projected`` (CLIPVisionEncode with a LLaVA vision file) and every
    ``image_interleave``-th of its tokens kept, encoded by the text-encoder files on the workers."""
    import torch

    projected = getattr(clip_vision_output, "mm_projected", None)
    if not isinstance(projected, torch.Tensor) or projected.ndim != 3:
        raise ConfigError(
            "the CLIP_VISION_OUTPUT holds no projected vision tokens (mm_projected)",
            "the image enters the prompt as LLaVA's vision tokens in the text model's width, which only a CLIP vision "
            "file with LLaVA's projector gives",
            "load llava_llama3_vision.safetensors with CLIPVisionLoader and encode the start image with "
            "CLIPVisionEncode",
        )
    if isinstance(image_interleave, bool) or not isinstance(image_interleave, int) or image_interleave < 1:
        raise ConfigError(
            f"image_interleave {image_interleave!r}",
            "every image_interleave-th vision token is kept (1: all of them)",
            "give a whole number of 1 or more (ComfyUI's default is 2)",
        )
    vision = {"states": projected.detach().float().cpu(), "interleave": image_interleave}
    further = {} if text_encoder_2 is None else {"text_encoder_2": text_encoder_2}
    return from_runtime(model.encode_text(text, text_encoder, vision=vision, **further))


def encode_edit(
    model: ParallelModel,
    text: str,
    text_encoder: tuple[str, str | None] | None,
    images: list[Any],
    mode: str,
    vae: Any = None,
) -> list[list[Any]]:
    """ComfyUI CONDITIONING of a Qwen-Image-Edit prompt with ``images`` (IMAGEs, None for an empty input) in it
    (``mode`` "edit" / "edit_plus", see ``ParallelModel.encode_edit_text``) and, with a ComfyUI ``vae``, each
    image's ``reference_latents`` made from the pixels ComfyUI's node scales for it."""
    from ..models.families.qwen_image.edit_prompt import reference_pixels

    conditioning = from_runtime(model.encode_edit_text(text, text_encoder, images, mode))
    given = [image for image in images if image is not None]
    if vae is None or not given:
        return conditioning
    latents = [vae.encode(reference_pixels(image, mode)) for image in given]
    return [[c, {**o, "reference_latents": [*o.get("reference_latents", []), *latents]}] for c, o in conditioning]


def decode(model: ParallelModel, samples: object) -> torch.Tensor:
    """ComfyUI IMAGE [B, H, W, 3] in 0..1 of a LATENT (a video's frames one after another)."""
    latent = samples.get("samples") if isinstance(samples, Mapping) else None
    if latent is None:
        raise ConfigError(
            f"samples is not a LATENT ({type(samples).__name__})",
            "a LATENT is a dict with a 'samples' tensor",
            "connect a LATENT output of this model (Parallel Sampler, VAE Encode, ...)",
        )
    return model.decode(latent).float().clamp(0.0, 1.0)


def lora(model: ParallelModel, path: str, strength_model: float, strength_clip: float) -> tuple[LoraSpec | None, str]:
    """The LoRA ``path`` at these strengths, checked against the loaded model by the API's own check
    (``ParallelModel.lora_checks``, as ``with_loras`` runs it: finite strengths within ComfyUI's range, a file
    that patches this model); None when both strengths are 0 (ComfyUI's loader then returns the model
    untouched). Also the text the node shows."""
    from pathlib import Path

    from .lora import LoraSpec

    spec = LoraSpec.of(path, strength_model, strength_clip)
    resolution = model.lora_checks.check(spec, model.lora_keys)
    if resolution is None:
        return None, f"{Path(path).name}: strength 0, not applied"
    return spec, f"{spec.describe()}: {resolution.summary()}"


def _shift(name: str, value: object) -> float:
    shift = input_checks.finite_number(name, value, "a shift moves the schedule's steps toward high noise")
    if not 0.0 <= shift <= MAX_SHIFT:
        raise ConfigError(f"{name}={shift}", f"a shift is from 0 to {MAX_SHIFT:g}", f"use a {name} in that range")
    return shift


def flux_sampling(max_shift: float, base_shift: float, width: int, height: int) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingFlux: the Flux shift of ``width`` x ``height`` pixels (``base_shift`` at 256
    tokens, ``max_shift`` at 4096, linear between)."""
    from ..denoise.model_sampling import model_sampling_flux_node

    width, height = input_checks.image_size(width, height)
    return model_sampling_flux_node(_shift("max_shift", max_shift), _shift("base_shift", base_shift), width, height)


def sd3_sampling(shift: float) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingSD3: discrete flow with ``shift`` (timesteps = sigma x 1000)."""
    from ..denoise.model_sampling import model_sampling_sd3_node

    return model_sampling_sd3_node(_shift("shift", shift))


def auraflow_sampling(shift: float) -> ModelSamplingSpec:
    """ComfyUI's ModelSamplingAuraFlow: discrete flow with ``shift`` (timesteps = sigma)."""
    from ..denoise.model_sampling import model_sampling_auraflow_node

    return model_sampling_auraflow_node(_shift("shift", shift))


def step_cache(kind: str, reuse_threshold: float, start_percent: float, end_percent: float, verbose: bool) -> Any:
    """The StepCacheSpec of a Parallel EasyCache (``kind`` "easycache") / LazyCache ("lazycache") node."""
    from ..denoise.caching.specs import StepCacheSpec

    return StepCacheSpec(kind, float(reuse_threshold), float(start_percent), float(end_percent), bool(verbose))


def block_cache(
    threshold: float, first_blocks: int, last_blocks: int, max_consecutive: int, warmup_steps: int, verbose: bool
) -> Any:
    """The BlockCacheSpec of a Parallel Block Cache node."""
    from ..denoise.caching.specs import BlockCacheSpec

    values = (int(first_blocks), int(last_blocks), int(max_consecutive), int(warmup_steps))
    return BlockCacheSpec(float(threshold), *values, bool(verbose))
