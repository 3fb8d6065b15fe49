"""Parallel Sampler: KSampler's inputs, run on the worker pool, with progress, previews and cancel.

It computes what ComfyUI's KSampler computes for the same graph (``service.comfy_graph.sample``): the model
sampling in force (the file's default unless a Parallel Model Sampling node set one; the node shows which),
each conditioning entry with its own guidance, strength and timestep range, the LATENT's batch_index for the
noise (and kept on the output), an empty latent left unshifted, sizes padded to the patch size.
"""

from __future__ import annotations

import logging
from typing import Any

from parallel_runtime.errors import ConfigError, JobCancelled
from parallel_runtime.service import choices as limits

from .context import NodeContext
from .declare import Choice, DeclaredNode, Float, Input, Int, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .progress import JobMonitor, run_with_events

log = logging.getLogger("dit_parallel.nodes")


def sampler_names() -> list[str]:
    from parallel_runtime.service.comfy_graph import sampler_choices

    return sampler_choices()[0]


def scheduler_names() -> list[str]:
    from parallel_runtime.service.comfy_graph import sampler_choices

    return sampler_choices()[1]


def seed_input(name: str) -> Input:
    return Int(name, "Noise seed.", 0, 0, limits.SEED_MAX, control_after_generate=True)


def cfg_input(default: float, tooltip: str) -> Input:
    return Float("cfg", tooltip, default, 0.0, limits.MAX_CFG, step=0.1, round=0.01)


def check_schedule(steps: int, denoise: float) -> bool | str:
    """VALIDATE_INPUTS' answer for steps and denoise: the service's own check."""
    from parallel_runtime.service.input_checks import schedule

    try:
        schedule(steps, denoise)
    except ConfigError as exc:
        return str(exc)
    return True


def run_sampler(
    ctx: NodeContext, parallel_model: ParallelModelHandle, latent_image: dict, **settings: Any
) -> dict[str, Any]:
    """Sample on the pool with progress, previews, cancel and status (shared by both sampler nodes); returns the
    node's output ({"ui": the model sampling in force, "result": (LATENT,)}). ``settings``:
    ``service.comfy_graph.sample``'s keyword arguments (positive, negative, seed, steps, ...)."""
    from parallel_runtime.service import comfy_graph

    model = parallel_model.model()
    sigmas = settings.get("sigmas")
    total = (len(sigmas) - 1) if sigmas is not None else settings["steps"]
    pool = parallel_model.pool_id
    monitor = JobMonitor(ctx.bridge, ctx.status, pool, total, len(parallel_model.devices))
    in_force = comfy_graph.sampling_text(model)
    log.info("dit-parallel sampler: %s", in_force)

    def job(on_event, should_cancel):
        return comfy_graph.sample(
            model, latent=latent_image, on_event=on_event, should_cancel=should_cancel, **settings
        )

    ctx.status.job(pool, "sample", "running")
    try:
        result = run_with_events(job, monitor.handle, ctx.bridge)
    except JobCancelled as exc:
        ctx.status.job(pool, "sample", "cancelled")
        ctx.bridge.raise_interrupted(exc)
        raise
    except BaseException as exc:
        ctx.status.job(pool, "sample", "cancelled" if ctx.bridge.is_interrupt(exc) else "error", str(exc))
        raise
    ctx.status.job(pool, "sample", "done")
    text = "; ".join([in_force, *(cache_text(s) for s in monitor.cache_summaries)])
    return {"ui": {"text": [text]}, "result": (result,)}


def cache_text(summary: dict) -> str:
    """One cache's summary as the sampler node shows it, e.g. "EasyCache skipped 8/20 model evaluations"."""
    if "skipped" in summary:
        return f"{summary['cache']} skipped {summary['skipped']}/{summary['evaluations']} evaluations"
    return f"{summary.get('cache', 'cache')} reused {summary.get('reused', 0)}/{summary.get('calls', 0)} calls"


MODEL_INPUT = Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader.")


class ParallelSampler(DeclaredNode):
    """Denoises a LATENT on the worker pool with ComfyUI's sampler and scheduler math."""

    SPEC = NodeSpec(
        node_id="DiTParallelSampler",
        display_name="Parallel Sampler",
        description=(
            "Like KSampler, but the model runs split across the worker pool. Takes CONDITIONING from Parallel Text "
            "Encode or ComfyUI's own text encoders when the shapes fit the model."
        ),
        inputs=(
            MODEL_INPUT,
            Socket("positive", "CONDITIONING", "What the image should show."),
            Socket("negative", "CONDITIONING", "What to steer away from (used when cfg > 1)."),
            Socket("latent_image", "LATENT", "Empty latent (text to image) or an encoded image (denoise < 1)."),
            seed_input("seed"),
            Int("steps", "Denoising steps.", 20, 1, limits.MAX_STEPS),
            cfg_input(4.5, "Classifier-free guidance scale (1.0 for Flux dev/schnell: no negative pass)."),
            Choice("sampler_name", "ComfyUI sampler.", sampler_names, default="euler"),
            Choice("scheduler", "ComfyUI scheduler.", scheduler_names, default="simple"),
            Float("denoise", "Below 1 keeps part of the input latent.", 1.0, 0.0, 1.0, step=0.01),
            Socket("sigmas", "SIGMAS", "Custom sigma schedule (replaces steps, scheduler and denoise).", True),
            Socket(
                "sampler",
                "SAMPLER",
                "A ComfyUI SAMPLER (KSamplerSelect, SamplerEulerAncestral, SamplerDPMPP_2M_SDE, ...): replaces "
                "sampler_name and brings its eta / s_noise.",
                True,
            ),
            Float(
                "guidance",
                "Distilled guidance of conditioning entries without their own (FluxGuidance sets it per entry, on "
                "the negative too; KSampler uses 3.5). Read by the models with a guidance embedding (Flux, FLUX.2, "
                "HunyuanVideo); ignored by the others (SD3, Chroma, PixArt, Qwen-Image, Wan, ...).",
                limits.DEFAULT_GUIDANCE,
                0.0,
                limits.MAX_GUIDANCE,
                step=0.1,
                optional=True,
            ),
        ),
        outputs=(Output("LATENT", "The denoised latent (raw VAE latent, ComfyUI's convention)."),),
        function="sample",
    )

    @classmethod
    def VALIDATE_INPUTS(cls, steps: int, denoise: float) -> bool | str:  # noqa: N802
        return check_schedule(steps, denoise)

    def sample(
        self,
        parallel_model: ParallelModelHandle,
        positive: list,
        negative: list,
        latent_image: dict,
        seed: int,
        steps: int,
        cfg: float,
        sampler_name: str,
        scheduler: str,
        denoise: float,
        sigmas: Any = None,
        guidance: float = limits.DEFAULT_GUIDANCE,
        sampler: Any = None,
    ) -> dict[str, Any]:
        return run_sampler(
            self.context,
            parallel_model,
            latent_image,
            positive=positive,
            negative=negative,
            seed=seed,
            steps=steps,
            cfg=cfg,
            sampler_name=sampler_name,
            scheduler=scheduler,
            denoise=denoise,
            sigmas=sigmas,
            guidance=guidance,
            sampler=sampler,
        )
