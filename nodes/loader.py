"""Parallel Model Loader: pick a model, devices and a layout; start (or reuse) the worker pool."""

from __future__ import annotations

import logging
from typing import Any

from parallel_runtime.errors import ConfigError
from parallel_runtime.service import choices as limits
from parallel_runtime.service.families import family_choices

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Float, Input, Int, NodeSpec, Output
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import VAE_FROM_MODEL, model_choices, resolve_model, resolve_vae, single_files, vae_choices

NO_SECOND_EXPERT = "(none: one transformer)"

log = logging.getLogger("dit_parallel.nodes")


def _degree(name: str, tooltip: str, maximum: int = limits.MAX_DEGREE) -> Input:
    return Int(name, tooltip + " Used when layout is manual.", 1, 1, maximum)


class ParallelModelLoader(DeclaredNode):
    """Loads a Flux / SD3 / PixArt / Qwen-Image / FLUX.2 / Wan pipeline onto worker processes, one per device."""

    SPEC = NodeSpec(
        node_id="DiTParallelModelLoader",
        display_name="Parallel Model Loader",
        description=(
            "Starts one worker process per device and loads the model split across them. The layout (how the "
            "work is split) is chosen automatically from the GPUs and their links, or set by hand."
        ),
        inputs=(
            Choice(
                "model",
                "A diffusers folder (models/diffusers), a single transformer .safetensors or GGUF (.gguf, "
                "ComfyUI-GGUF's) file (models/diffusion_models, models/unet), a full .safetensors checkpoint "
                "(models/checkpoints, listed after them; one named like a diffusion_models file shows as "
                "'[checkpoints] <name>'), or a tiny random model for trying the pack without downloads.",
                lambda: model_choices(shared_bridge()),
            ),
            Choice("family", "Model family; 'auto' detects it from the files.", family_choices, default="auto"),
            Input(
                "devices",
                "STRING",
                '"all" (every visible GPU), a list such as "cuda:0,cuda:1", or "cpu:2" for CPU workers.',
                default="all",
            ),
            Choice(
                "layout",
                "auto: chosen from GPU count, NVLink/P2P links, free memory, heads and resolution. "
                "manual: the degrees below (their product must equal the number of devices).",
                limits.LAYOUTS,
                default="auto",
            ),
            _degree("ulysses", "Ulysses sequence parallel degree (all-to-all over heads; wants NVLink/P2P)."),
            _degree("ring", "Ring attention degree (K/V passed around; for the rest of the sequence split)."),
            _degree(
                "cfg_parallel",
                "CFG parallel degree: 2 runs cond and uncond on different devices.",
                limits.MAX_CFG_DEGREE,
            ),
            _degree("pipefusion", "PipeFusion degree: transformer layers split into this many stages."),
            Int("pp_patches", "PipeFusion patches (row bands); 0 = automatic.", 0, 0, limits.MAX_PP_PATCHES),
            Int("pp_warmup", "PipeFusion steps run on the whole image first.", 1, 0, limits.MAX_PP_WARMUP),
            Choice("dtype", "Weight and compute precision.", limits.DTYPES, default="bf16"),
            Choice(
                "attention",
                "Attention kernel. auto: the fastest exact one for the GPU (FlashAttention 3 on Hopper, flash-attn 2 "
                "on Ampere/Ada when installed, else torch SDPA); sage: SageAttention (faster on consumer GPUs, "
                "slightly lossy); cudnn: torch's cuDNN kernel. The node says which kernel runs and why.",
                limits.ATTENTION,
                default="auto",
            ),
            Choice(
                "vae",
                "The VAE that Parallel VAE Decode uses: the model's own (a diffusers folder's, or a full "
                "checkpoint's), or a file from models/vae, e.g. ae.safetensors for a Flux transformer file, "
                "which carries none.",
                lambda: vae_choices(shared_bridge()),
                default=VAE_FROM_MODEL,
                optional=True,
            ),
            Choice(
                "weights",
                "How the transformer's Linear weights are held. as file: an fp8 file (e.g. "
                "qwen_image_fp8_e4m3fn.safetensors) stays fp8 on the devices, each layer upcast to dtype when it "
                "runs; fp8_e4m3fn: also store a bf16 model's blocks in fp8 (half the memory); convert to dtype: "
                "upcast fp8 files to dtype once, at load. A GGUF file's weights stay in their quantised blocks "
                "with 'as file' (dequantised per layer as it runs) and are dequantised once, at load, with "
                "'convert to dtype'.",
                tuple(limits.WEIGHTS),
                default="as file",
                optional=True,
            ),
            Choice(
                "dequant_dtype",
                "GGUF files only: the arithmetic of dequantisation, as ComfyUI-GGUF's Unet Loader (GGUF/Advanced) "
                "offers it. default: block scales times quantised values in float16, then cast to dtype (what Unet "
                "Loader (GGUF) does); target: in dtype; float32 / float16 / bfloat16: in that type.",
                limits.DEQUANT_DTYPES,
                default="default",
                optional=True,
            ),
            Choice(
                "low_noise_model",
                "Wan 2.2 A14B from two files: pick the high-noise file as model and the low-noise file here. Both "
                "stay loaded in one worker pool and one Parallel Sampler switches expert at expert_boundary, as "
                "ComfyUI's two KSamplerAdvanced passes do; not with PipeFusion.",
                lambda: [NO_SECOND_EXPERT, *single_files(shared_bridge())],
                default=NO_SECOND_EXPERT,
                optional=True,
            ),
            Float(
                "expert_boundary",
                "With a low_noise_model: the sigma below which it denoises. 0 = the model's (0.875 text-to-video, "
                "0.9 image-to-video, as diffusers' Wan 2.2 pipelines).",
                0.0,
                0.0,
                0.999,
                step=0.001,
                optional=True,
            ),
            Choice(
                "compile",
                "blocks: torch.compile each kind of transformer block once per image size (the first run compiles "
                "for a while; the warm workers keep it, a new seed or prompt compiles nothing). off: run the blocks "
                "as they are.",
                limits.COMPILE,
                default="off",
                optional=True,
            ),
            Choice(
                "fp8_matmul",
                "fp8 weights on GPUs with fp8 matrix units (RTX 40xx, H100, sm89+): auto multiplies in fp8 (faster; "
                "each product ~3% rounding); upcast widens each weight per call (exact).",
                limits.FP8_MATMUL,
                default="auto",
                optional=True,
            ),
        ),
        outputs=(
            Output(
                PARALLEL_MODEL,
                "The model running on the worker pool; connect it to the other DiT Parallel nodes.",
                "parallel_model",
            ),
        ),
        function="load",
    )

    @classmethod
    def VALIDATE_INPUTS(cls, devices: str) -> bool | str:  # noqa: N802
        """Reject devices that cannot work before the prompt runs (the service's own check). Only ``devices``
        is named: ComfyUI reports a problem once per named input and range-checks the others itself. A manual
        layout that does not fit the devices is refused by ``load`` before any worker starts."""
        from parallel_runtime.service.load_plan import check_devices

        try:
            check_devices(devices)
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
        low_noise_model: str = NO_SECOND_EXPERT,
        expert_boundary: float = 0.0,
        compile: str = "off",
        fp8_matmul: str = "auto",
    ) -> dict[str, Any]:
        from parallel_runtime.service import load_plan as plan

        ctx = self.context
        choices = plan.LoadChoices(
            model=resolve_model(model, ctx.bridge),
            family=family,
            devices=devices,
            layout=layout,
            ulysses=ulysses,
            ring=ring,
            cfg_parallel=cfg_parallel,
            pipefusion=pipefusion,
            pp_patches=pp_patches,
            pp_warmup=pp_warmup,
            dtype=dtype,
            attention=attention,
            vae=resolve_vae(vae, ctx.bridge),
            weights=weights,
            dequant_dtype=dequant_dtype,
            expert_2=None if low_noise_model == NO_SECOND_EXPERT else resolve_model(low_noise_model, ctx.bridge),
            expert_boundary=expert_boundary,
            compile=compile,
            fp8_matmul=fp8_matmul,
        )
        planned = plan.plan_load(choices, ctx.bridge.free_memory_for)
        handle = ParallelModelHandle(
            planned.request, ctx, model, planned.family, planned.devices, planned.layout, planned.reason
        )
        loaded = handle.model(room_made=planned.room_made)  # start the workers now: load errors show here
        text = f"{model} ({planned.family}) on {plan.devices_spec(planned.devices)}: {planned.reason}"
        text += speed_text(getattr(loaded, "info", {}))
        log.info("dit-parallel layout: %s", text)
        return {"ui": {"text": [text]}, "result": (handle,)}


def speed_text(info: dict[str, Any]) -> str:
    """What the workers chose for speed (attention kernel and why, fp8 products, compiled blocks)."""
    parts = []
    if info.get("attention_choice"):
        parts.append(f"attention: {info['attention_choice']}")
    if info.get("fp8_matmul") and info["fp8_matmul"] != "no fp8 layers":
        parts.append(info["fp8_matmul"])
    if info.get("compile") == "blocks":
        parts.append("blocks compiled (torch.compile, once per size)")
    return "".join(f"; {p}" for p in parts)
