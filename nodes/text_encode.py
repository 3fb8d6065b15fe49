"""Parallel Text Encode: the loaded pipeline's own text encoders, or a text-encoder file -> ComfyUI CONDITIONING."""

from __future__ import annotations

from typing import Any

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Input, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import (
    TEXT_ENCODER_NONE,
    TEXT_ENCODER_OWN,
    resolve_text_encoder,
    second_text_encoder_choices,
    text_encoder_choices,
)


class ParallelTextEncode(DeclaredNode):
    """Encodes a prompt with the text encoders that came with the parallel model."""

    SPEC = NodeSpec(
        node_id="DiTParallelTextEncode",
        display_name="Parallel Text Encode",
        description=(
            "Encodes a prompt into ComfyUI conditioning with the model's own text encoders (CLIP / T5 / Qwen2.5-VL "
            "/ Mistral of a diffusers folder), or with text-encoder files (Qwen-Image's Qwen2.5-VL, Z-Image's Qwen3, Wan's UMT5, Chroma's / PixArt's / LTX-Video's T5-XXL, SD3's CLIP-L + CLIP-G + T5-XXL (or fewer), Flux.1's T5-XXL + CLIP-L, HunyuanVideo's LLaVA-Llama-3 + CLIP-L, HunyuanVideo 1.5's Qwen2.5-VL + ByT5, HiDream's Llama-3.1 + T5-XXL + CLIP-L + CLIP-G, LTX-2's Gemma-3 with the text connectors of the loaded LTX-2 checkpoint)."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader."),
            Input("text", "STRING", "The prompt.", multiline=True, dynamic_prompts=True),
            Choice(
                "text_encoder",
                "The model's own encoders (a diffusers folder's), or a file from models/text_encoders or "
                "models/clip (qwen_2.5_vl_7b*.safetensors, or a Qwen2.5-VL GGUF as ComfyUI-GGUF's CLIPLoaderGGUF "
                "reads it, for a Qwen-Image transformer file; umt5_xxl* for Wan; t5xxl* for Chroma / SD3 / PixArt / "
                "LTX-Video; mistral_3_small_flux2*.safetensors for FLUX.2; t5xxl* with clip_l as text_encoder_2 for "
                "Flux.1; llava_llama3* with clip_l for HunyuanVideo; qwen_2.5_vl_7b* with byt5_small_glyphxl* for "
                "HunyuanVideo 1.5; gemma_3_12B_it*.safetensors for LTX-2 (its text connectors come from the loaded LTX-2 "
                "checkpoint, or a file of them as text_encoder_2); for SD3 / SD3.5 clip_l, clip_g and t5xxl* in "
                "text_encoder .. text_encoder_3; for HiDream its four files in text_encoder .. text_encoder_4).",
                lambda: text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_OWN,
                optional=True,
            ),
            Choice(
                "text_encoder_2",
                "A second text-encoder file, for a family that reads two as ComfyUI's DualCLIPLoader: clip_l.safetensors "
                "beside t5xxl* for Flux.1 or llava_llama3* for HunyuanVideo, byt5_small_glyphxl* beside qwen_2.5_vl_7b* for "
                "HunyuanVideo 1.5 (either order); one of SD3's three or HiDream's four (see text_encoder_3); for LTX-2, a "
                "file of its text connectors when the loaded model's file lacks them. (none) for every other family.",
                lambda: second_text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_NONE,
                optional=True,
            ),
            Choice(
                "text_encoder_3",
                "A third text-encoder file, for SD3 / SD3.5 (clip_l, clip_g, t5xxl* as ComfyUI's TripleCLIPLoader, any order; "
                "any two as its DualCLIPLoader type sd3) and HiDream (its four files as ComfyUI's QuadrupleCLIPLoader, any "
                "order: llama_3.1_8b_instruct*, t5xxl*, clip_l_hidream, clip_g_hidream). (none) for every other family.",
                lambda: second_text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_NONE,
                optional=True,
            ),
            Choice(
                "text_encoder_4",
                "A fourth text-encoder file, for HiDream (see text_encoder_3). (none) for every other family.",
                lambda: second_text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_NONE,
                optional=True,
            ),
        ),
        outputs=(
            Output("CONDITIONING", "Text conditioning for Parallel Sampler (or any node that takes CONDITIONING)."),
        ),
        function="encode",
    )

    def encode(
        self,
        parallel_model: ParallelModelHandle,
        text: str,
        text_encoder: str = TEXT_ENCODER_OWN,
        text_encoder_2: str = TEXT_ENCODER_NONE,
        text_encoder_3: str = TEXT_ENCODER_NONE,
        text_encoder_4: str = TEXT_ENCODER_NONE,
    ) -> tuple[list]:
        from parallel_runtime.service.comfy_graph import encode

        model = parallel_model.model()
        bridge = parallel_model.context.bridge
        names = (text_encoder, text_encoder_2, text_encoder_3, text_encoder_4)
        first, second, third, fourth = (resolve_text_encoder(n, bridge) for n in names)
        further = {"text_encoder_3": third, "text_encoder_4": fourth}
        return (encode(model, text, first, second, **{k: v for k, v in further.items() if v is not None}),)


class ParallelTextEncodeHunyuanVideoImageToVideo(DeclaredNode):
    """TextEncodeHunyuanVideo_ImageToVideo on the workers: the prompt with the start image's LLaVA vision tokens."""

    SPEC = NodeSpec(
        node_id="DiTParallelTextEncodeHunyuanVideoImageToVideo",
        display_name="Parallel Text Encode HunyuanVideo Image To Video",
        description=(
            "ComfyUI's TextEncodeHunyuanVideo_ImageToVideo with the text encoders on the parallel workers: the prompt "
            "in HunyuanVideo-I2V's template with the start image's vision tokens (CLIPVisionEncode with "
            "llava_llama3_vision.safetensors), from the llava_llama3* and clip_l files."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader (a HunyuanVideo transformer)."),
            Socket("clip_vision_output", "CLIP_VISION_OUTPUT", "CLIPVisionEncode's output (llava_llama3_vision)."),
            Input("prompt", "STRING", "The prompt.", multiline=True, dynamic_prompts=True),
            Input(
                "image_interleave",
                "INT",
                "How much the image influences things vs the text prompt: every Nth vision token is kept. Higher "
                "number means more influence from the text prompt.",
                default=2,
                min=1,
                max=512,
            ),
            Choice(
                "text_encoder",
                "llava_llama3* from models/text_encoders (its Llama; the vision tower is the CLIP vision file).",
                lambda: text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_OWN,
            ),
            Choice(
                "text_encoder_2",
                "clip_l.safetensors (either order with text_encoder, as DualCLIPLoader type hunyuan_video).",
                lambda: second_text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_NONE,
            ),
        ),
        outputs=(Output("CONDITIONING", "For HunyuanImageToVideo / Parallel Sampler."),),
        function="encode",
    )

    def encode(
        self,
        parallel_model: ParallelModelHandle,
        clip_vision_output: Any,
        prompt: str,
        image_interleave: int = 2,
        text_encoder: str = TEXT_ENCODER_OWN,
        text_encoder_2: str = TEXT_ENCODER_NONE,
    ) -> tuple[list]:
        from parallel_runtime.service.comfy_graph import encode_with_image

        bridge = parallel_model.context.bridge
        first, second = (resolve_text_encoder(n, bridge) for n in (text_encoder, text_encoder_2))
        model = parallel_model.model()
        return (encode_with_image(model, prompt, clip_vision_output, image_interleave, first, second),)
