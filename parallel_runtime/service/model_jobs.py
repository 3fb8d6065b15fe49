"""Worker-side jobs of a loaded model: encode text, generate (denoise), decode.

The model is the one :func:`~.load_job.load_model` put in ``ctx.state``. Every job runs on every
rank; collectives inside happen in the same order everywhere.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..denoise.entries import Branch, as_branch
from ..denoise.loop import denoise_latent
from ..denoise.model_sampling import model_sampling_for
from ..denoise.settings import SamplingSettings
from ..errors import ConfigError, NonFiniteValues
from ..models.base import Conditioning
from ..models.families.registry import FAMILIES, family
from ..models.lora.patcher import StackEntry
from ..models.preview import plan_preview
from ..models.video_vae import DEFAULT_DECODE_SEED
from ..runtime.cancel_points import BlockCancel
from ..runtime.jobs import JobContext
from .controlnets import control_files, loaded_controlnets
from .load_job import TEXT_RANK, LoadedModel, loaded_model, text_file_placement
from .lora_state import bring_to_stack

MEMORY_EVERY_S = 1.0


def _require_part(model: LoadedModel, part: str) -> None:
    """A single-file model holds only the transformer (and a VAE when one was given or the file is
    a full checkpoint): name the ComfyUI nodes that do ``part`` otherwise."""
    missing = model.components.vae is None if part == "vae" else model.components.path.is_file()
    if missing:
        from ..models.single_file import missing_part_error

        raise missing_part_error(model.components.path, part)


def encode_text(
    ctx: JobContext, prompts: list[str], max_sequence_length: int | None = None, loras: tuple[StackEntry, ...] = ()
) -> list[Conditioning] | None:
    """Encode each prompt (on TEXT_RANK) into a Conditioning on the CPU, with the text encoders patched
    by the LoRA stack ``loras`` (their strength_clip)."""
    from ..models.text_encoding import encode_prompt

    model = loaded_model(ctx)
    _require_part(model, "text")
    if ctx.rank != TEXT_RANK:
        return None
    bring_to_stack(model, loras, "text")
    out = []
    with torch.no_grad():
        for prompt in prompts:
            cond = encode_prompt(model.components, model.adapter.plan.family, prompt, max_sequence_length)
            for part, tensor in (("embeddings", cond.prompt_embeds), ("pooled output", cond.pooled)):
                if tensor is not None and not torch.isfinite(tensor).all():
                    raise NonFiniteValues(f"the text encoders' {part} for prompt {prompt[:60]!r}")
            out.append(cond.to("cpu", torch.float32))
    return out


def encode_text_file(
    ctx: JobContext,
    encoder_path: str,
    tokenizer_dir: str | None,
    prompts: list[str],
    max_sequence_length: int | None = None,
    overrides: dict[str, Any] | None = None,
    second: tuple[str, str | None] | None = None,
    more: tuple[tuple[str, str | None], ...] = (),
    vision: dict[str, Any] | None = None,
) -> list[Conditioning] | None:
    """Encode each prompt with a text-encoder FILE (ComfyUI's models/text_encoders, of a family that reads one:
    Qwen-Image's Qwen2.5-VL, Wan's UMT5, ...) on TEXT_RANK, in the model's dtype: on one device, or spread over
    the pool's GPUs by layers when larger than what any one has left (``load_job.text_file_placement``); with
    ``second`` = (file, tokenizer folder), the second file a family reads beside the first (Flux.1's CLIP-L), and
    ``more`` the further ones (HiDream's), on the first one's device; ``vision``: an image's vision tokens for
    the prompt (``TextEncoderFile.takes_vision``). The encoders stay loaded for the next prompts."""
    model = loaded_model(ctx)
    family_id = model.adapter.plan.family
    spec = family(family_id)
    if spec.text_encoder_file is None:
        readers = [f"{f.text_encoder_file().what} files ({f.label}'s)" for f in FAMILIES if f.text_encoder_file]
        raise ConfigError(
            f"a text-encoder file for a {family_id} model",
            f"Parallel Text Encode reads {' and '.join(readers)} from models/text_encoders",
            "encode with ComfyUI's CLIPLoader + CLIPTextEncode, or load the model's diffusers folder",
        )
    others = (*((second,) if second is not None else ()), *more)
    reader = spec.text_encoder_file().for_files([encoder_path, *(f for f, _ in others)])
    if len(others) != len(reader.extra_files) + (reader.model_part is not None):
        count = {0: "one text-encoder file", 1: "two text-encoder files"}.get(len(others), f"{len(others) + 1} files")
        kinds = " + ".join([reader.what, *(e.what for e in reader.extra_files)])
        raise ConfigError(
            f"{count} for a {family_id} model",
            f"{spec.label} reads {kinds}, one file each"
            if reader.extra_files
            else f"{spec.label} reads one {reader.what} file",
            "give the files the family reads (Parallel Text Encode's text_encoder / text_encoder_2 ...)",
        )
    if vision is not None and not reader.takes_vision:
        raise ConfigError(
            f"an image's vision tokens for a {spec.label} prompt",
            f"{spec.label}'s {reader.what} file encodes text only",
            "encode the prompt without the image (Parallel Text Encode)",
        )
    if ctx.rank != TEXT_RANK:
        return None
    encoder, tokenizer = text_file_encoder(ctx, model, reader, encoder_path, tokenizer_dir, overrides, others)
    length = max_sequence_length or reader.default_length
    extra = {} if vision is None else {"vision": vision}
    with torch.no_grad():
        return [reader.encode(encoder, tokenizer, [p], length, **extra).to("cpu", torch.float32) for p in prompts]


def text_file_encoder(
    ctx: JobContext,
    model: LoadedModel,
    reader: Any,
    encoder_path: str,
    tokenizer_dir: str | None,
    overrides: dict[str, Any] | None,
    others: tuple[tuple[str, str | None], ...] = (),
) -> tuple[Any, Any]:
    """The text-encoder file's model and tokenizer on this rank (see ``encode_text_file``), loaded once and kept
    for the next prompts; with ``others`` (the further files, in the reader's order, the reader's ``model_part``'s
    source last), tuples of every file's encoder (the part's last) and of every file's tokenizer."""
    from transformers import AutoTokenizer

    key = (encoder_path, tokenizer_dir, str(overrides), model.adapter.dtype, others)
    cached = ctx.state.get("text_file")
    if cached is None or cached[0] != key:
        ctx.state.pop("text_file", None)
        part = reader.model_part
        if part is not None:
            others, (part_path, _) = others[:-1], others[-1]
        if model.devices:
            part_bytes = part.nbytes(part_path) if part is not None else 0
            where = text_file_placement(model, encoder_path, [f for f, _ in others], part_bytes)
        else:
            where = str(ctx.device)
        if isinstance(where, Mapping):  # larger than any one GPU's room: its layers over the GPUs
            from ..models.layer_spread import spread_by_layers

            encoder = reader.load(encoder_path, "cpu", model.adapter.dtype, overrides=overrides)
            encoder = spread_by_layers(encoder, where)
        else:
            encoder = reader.load(encoder_path, where, model.adapter.dtype, overrides=overrides)
        if reader.tokenizer is not None:  # the file carries its tokenizer
            tokenizer = reader.tokenizer(encoder_path, tokenizer_dir)
        else:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        if others:
            device = next(iter(where)) if isinstance(where, Mapping) else where
            kinds = reader.extra_files
            encoder = (encoder, *(kind.load(path, device) for kind, (path, _) in zip(kinds, others)))
            tokenizer = (tokenizer, *(AutoTokenizer.from_pretrained(t, local_files_only=True) for _, t in others))
        if part is not None:  # on the first encoder's device, after it
            device = next(iter(where)) if isinstance(where, Mapping) else where
            loaded = part.load(part_path, device, model.adapter.dtype, overrides=overrides)
            encoder = (*encoder, loaded) if others else (encoder, loaded)
        cached = (key, encoder, tokenizer)
        ctx.state["text_file"] = cached
    return cached[1], cached[2]


def generate(
    ctx: JobContext,
    positive: Branch | Conditioning,
    negative: Branch | Conditioning | None,
    latent: torch.Tensor,
    settings: SamplingSettings,
    preview: bool = True,
    patches: int | None = None,
    warmup: int = 1,
    loras: tuple[StackEntry, ...] = (),
    noise_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Denoise ``latent`` (raw VAE latent, [B,C,H,W] or video [B,C,T,H,W]) with KSampler /
    KSamplerAdvanced semantics (``noise_mask``: the LATENT's); returns the raw latent (CPU). A two-expert
    model switches experts at its boundary. Every rank emits its own progress each step (with pp > 1: after
    each patch, with the steps that rank has finished) and its memory now and then; the preview comes from
    rank 0 (with pp > 1: the last stage), just before that rank's progress for the same step. Cancel is
    agreed each step and, inside a step, at block boundaries (with pp > 1: at pipeline slots; see
    runtime.cancel_points). With pp > 1 it runs PipeFusion (``patches`` row bands, ``warmup`` whole-image
    steps). The transformer is first brought to the LoRA stack ``loras``
    (each rank patches what it holds; nothing is reloaded; a second expert is patched with the same stack). The model
    sampling is the settings' (a ModelSampling node's) or the family's default for the loaded file. With a
    step or block cache every rank reports what it did in a "cache" event (a list of summaries) at the end."""
    model = loaded_model(ctx)
    bring_to_stack(model, loras, "transformer")
    memory = _MemoryReports(ctx)
    adapter = model.adapter
    files = control_files(as_branch(positive), as_branch(negative))
    controls = loaded_controlnets(ctx, adapter, files) if files else {}
    ms = model_sampling_for(adapter, settings.model_sampling)
    if model.stages is not None:
        from ..pipefusion.pipeline import PipeFusionSettings, run_pipefusion

        first_bad: list[str] = []  # the last stage's first step with non-finite values

        def on_patch_step(step: int, total: int, denoised: torch.Tensor) -> None:
            if not first_bad and not torch.isfinite(denoised).all():
                first_bad.append(f"denoising step {step + 1}/{total}")  # raised after the pipeline ends
            if preview:
                ctx.emit("preview", {"step": step + 1, "total": total, "image": plan_preview(adapter.plan, denoised)})

        def on_patch(done: int, total: int, patch: int | None, patches: int) -> None:
            event = {"step": done, "total": total, "patches": patches}
            if patch is not None:
                event["patch"] = patch
            memory.maybe(done == total)
            ctx.emit("progress", event)

        out, stats = run_pipefusion(
            adapter,
            ctx.mesh,
            model.stages,
            ms,
            positive,
            negative,
            latent.to(ctx.device),
            settings,
            PipeFusionSettings(patches=patches, warmup=warmup),
            attention_backend=model.attention,
            check_cancel=ctx.check_cancel,
            on_step=on_patch_step,
            on_patch=on_patch,
            message_tag=ctx.job_id,
            cancel_points=BlockCancel(ctx.cancel_requested, f"job {ctx.job_id}"),  # inside a step: at slots
            noise_mask=None if noise_mask is None else noise_mask.to(ctx.device),
            controls=controls,
        )
        if stats.cache:
            ctx.emit("cache", stats.cache)
        if first_bad:
            raise NonFiniteValues(first_bad[0])
        if out is not None and not torch.isfinite(out).all():
            raise NonFiniteValues("denoising (PipeFusion)")
        return out

    def on_step(step: int, total: int, x: torch.Tensor, denoised: torch.Tensor) -> None:
        ctx.check_cancel()  # collective: every rank calls it at the same step
        if not torch.isfinite(denoised).all():  # every rank holds the same prediction: all raise here
            raise NonFiniteValues(f"denoising step {step + 1}/{total}")
        if ctx.rank == 0 and preview:
            ctx.emit("preview", {"step": step + 1, "total": total, "image": plan_preview(adapter.plan, denoised)})
        memory.maybe(step + 1 == total)  # before the progress: the panel shows both from the first step
        ctx.emit("progress", {"step": step + 1, "total": total})

    experts = [adapter] + ([model.expert_2[0]] if model.expert_2 is not None else [])
    cancel = BlockCancel(ctx.cancel_requested, f"job {ctx.job_id}")  # agreed at block boundaries too
    for expert in experts:
        expert.block_hook = cancel
    try:
        out = denoise_latent(
            adapter,
            ctx.mesh,
            ms,
            on_device(positive, ctx.device),
            on_device(negative, ctx.device),
            latent.to(ctx.device),
            settings,
            attention_backend=model.attention,
            on_step=on_step,
            noise_mask=None if noise_mask is None else noise_mask.to(ctx.device),
            expert_2=model.expert_2,
            cache_report=lambda summaries: ctx.emit("cache", summaries),
            controls=controls,
        )
    finally:
        for expert in experts:
            expert.block_hook = None
    return out.cpu() if ctx.rank == 0 else None


class _MemoryReports:
    """This rank's memory for the status panel: at the first report, then at most every
    ``MEMORY_EVERY_S`` seconds, and at the end."""

    def __init__(self, ctx: JobContext):
        self.ctx = ctx
        self.last: float | None = None

    def maybe(self, final: bool = False) -> None:
        now = time.monotonic()
        if final or self.last is None or now - self.last >= MEMORY_EVERY_S:
            self.last = now
            self.ctx.report_memory()


def on_device(branch: Branch | Conditioning | None, device: torch.device) -> Branch | Conditioning | None:
    """The branch's conditioning tensors on ``device``."""
    if branch is None or isinstance(branch, Conditioning):
        return None if branch is None else branch.to(device)
    return tuple(dataclasses.replace(e, cond=e.cond.to(device)) for e in branch)


def decode(ctx: JobContext, latent: torch.Tensor, seed: int | None = None) -> torch.Tensor | None:
    """Exact parallel VAE decode of a raw latent over every rank; ComfyUI IMAGE on rank 0 (a Wan video latent
    [B,C,T,H,W]: its frames, row bands of every frame over the ranks; Qwen-Image's image: one frame of its
    Wan-style VAE, in bands the same way). ``seed``: the decode noise of an LTX-Video 0.9.1+ VAE (None: the
    default, ``DEFAULT_DECODE_SEED``)."""
    from ..vae.decode import decode_to_image_tensor
    from ..vae.latent_space import to_vae_space
    from ..vae.wan import is_wan_vae

    model = loaded_model(ctx)
    _require_part(model, "vae")
    vae = model.components.vae
    group = dist.group.WORLD if ctx.world_size > 1 else None
    with torch.no_grad():
        z = to_vae_space(vae, latent.to(ctx.device, next(vae.parameters()).dtype))
        if is_wan_vae(vae) and z.ndim == 4:  # an image through a Wan or Qwen-Image VAE: one frame
            z = z.unsqueeze(2)
        image = decode_to_image_tensor(
            vae, z, ctx.mesh, group, result_rank=0, seed=DEFAULT_DECODE_SEED if seed is None else seed
        )
    if image is not None and not torch.isfinite(image).all():
        raise NonFiniteValues("the VAE decode")
    return None if image is None else image.float().cpu()
