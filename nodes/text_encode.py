"""Parallel Text Encode: the loaded pipeline's own text encoders, or a text-encoder file -> ComfyUI CONDITIONING."""

from __future__ import annotations

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Input, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import TEXT_ENCODER_OWN, resolve_text_encoder, text_encoder_choices


class ParallelTextEncode(DeclaredNode):
    """Encodes a prompt with the text encoders that came with the parallel model."""

    SPEC = NodeSpec(
        node_id="DiTParallelTextEncode",
        display_name="Parallel Text Encode",
        description=(
            "Encodes a prompt into ComfyUI conditioning with the model's own text encoders (CLIP / T5 / Qwen2.5-VL "
            "/ Mistral of a diffusers folder), or with a text-encoder file (Qwen-Image's Qwen2.5-VL, Z-Image's Qwen3, Wan's UMT5, Chroma's / SD3's T5-XXL)."
        ),
        inputs=(
            Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader."),
            Input("text", "STRING", "The prompt.", multiline=True, dynamic_prompts=True),
            Choice(
                "text_encoder",
                "The model's own encoders (a diffusers folder's), or a file from models/text_encoders or "
                "models/clip (qwen_2.5_vl_7b*.safetensors, or a Qwen2.5-VL GGUF as ComfyUI-GGUF's CLIPLoaderGGUF "
                "reads it, for a Qwen-Image transformer file; umt5_xxl* for Wan; t5xxl* for Chroma / SD3; "
                "mistral_3_small_flux2*.safetensors for FLUX.2).",
                lambda: text_encoder_choices(shared_bridge()),
                default=TEXT_ENCODER_OWN,
                optional=True,
            ),
        ),
        outputs=(
            Output("CONDITIONING", "Text conditioning for Parallel Sampler (or any node that takes CONDITIONING)."),
        ),
        function="encode",
    )

    def encode(
        self, parallel_model: ParallelModelHandle, text: str, text_encoder: str = TEXT_ENCODER_OWN
    ) -> tuple[list]:
        from parallel_runtime.service.comfy_graph import encode

        model = parallel_model.model()
        return (encode(model, text, resolve_text_encoder(text_encoder, parallel_model.context.bridge)),)
