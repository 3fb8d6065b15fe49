"""Parallel Text Encode Qwen Image Edit (Plus): the edit prompt with its reference image(s) in it, encoded on the
workers from ComfyUI's Qwen2.5-VL file (text model + vision tower), plus the reference latents from a VAE.

Each node takes the inputs of the ComfyUI node it stands for (TextEncodeQwenImageEdit / ...EditPlus: prompt,
optional vae, image / image1..3) with a Parallel Model and a text-encoder file in place of the CLIP, and gives the
same CONDITIONING (its ``reference_latents`` included), so a shared edit workflow maps by swapping that one node.
"""

from __future__ import annotations

from typing import Any

from .context import shared_bridge
from .declare import Choice, DeclaredNode, Input, NodeSpec, Output, Socket
from .handles import PARALLEL_MODEL, ParallelModelHandle
from .model_files import TEXT_ENCODER_OWN, resolve_text_encoder, text_encoder_choices

_ENCODER_TIP = (
    "ComfyUI's Qwen2.5-VL file from models/text_encoders (qwen_2.5_vl_7b*.safetensors: bf16 or fp8 scaled; it holds "
    "the vision tower the images go through). GGUF files hold no vision tower."
)
_VAE_TIP = "Optional: the VAE that makes each image's reference latent (as ComfyUI's node does); none: text only."


def _common(images: tuple[Input, ...]) -> tuple[Input, ...]:
    return (
        Socket("parallel_model", PARALLEL_MODEL, "From Parallel Model Loader (a Qwen-Image-Edit transformer)."),
        Input("prompt", "STRING", "The edit instruction.", multiline=True, dynamic_prompts=True),
        Choice("text_encoder", _ENCODER_TIP, lambda: text_encoder_choices(shared_bridge()), default=TEXT_ENCODER_OWN),
        Socket("vae", "VAE", _VAE_TIP, optional=True),
        *images,
    )


def _encode(handle: ParallelModelHandle, prompt: str, text_encoder: str, vae: Any, images: list, mode: str):
    from parallel_runtime.service.comfy_graph import encode_edit

    encoder = resolve_text_encoder(text_encoder, handle.context.bridge)
    return (encode_edit(handle.model(), prompt, encoder, images, mode, vae),)


class ParallelTextEncodeQwenImageEdit(DeclaredNode):
    """TextEncodeQwenImageEdit on the workers: one reference image in the prompt (scaled to ~1 MP)."""

    SPEC = NodeSpec(
        node_id="DiTParallelTextEncodeQwenImageEdit",
        display_name="Parallel Text Encode Qwen Image Edit",
        description=(
            "ComfyUI's TextEncodeQwenImageEdit with the text encoder on the parallel workers: the prompt with the "
            "image in it (through Qwen2.5-VL's vision tower), and the image's reference latent when a VAE is given."
        ),
        inputs=_common((Socket("image", "IMAGE", "The picture to edit.", optional=True),)),
        outputs=(Output("CONDITIONING", "For Parallel Sampler (reference latents included)."),),
        function="encode",
    )

    def encode(
        self, parallel_model: ParallelModelHandle, prompt: str, text_encoder: str, vae: Any = None, image: Any = None
    ) -> tuple[list]:
        return _encode(parallel_model, prompt, text_encoder, vae, [image], "edit")


class ParallelTextEncodeQwenImageEditPlus(DeclaredNode):
    """TextEncodeQwenImageEditPlus on the workers: up to three images ("Picture N:"), each scaled to ~384x384 for
    the vision tower and to ~1 MP (sides multiples of 8) for its reference latent."""

    SPEC = NodeSpec(
        node_id="DiTParallelTextEncodeQwenImageEditPlus",
        display_name="Parallel Text Encode Qwen Image Edit Plus",
        description=(
            "ComfyUI's TextEncodeQwenImageEditPlus (Qwen-Image-Edit 2509) with the text encoder on the parallel "
            "workers: up to three pictures in the prompt, and their reference latents when a VAE is given."
        ),
        inputs=_common(tuple(Socket(f"image{i}", "IMAGE", f"Picture {i}.", optional=True) for i in (1, 2, 3))),
        outputs=(Output("CONDITIONING", "For Parallel Sampler (reference latents included)."),),
        function="encode",
    )

    def encode(
        self,
        parallel_model: ParallelModelHandle,
        prompt: str,
        text_encoder: str,
        vae: Any = None,
        image1: Any = None,
        image2: Any = None,
        image3: Any = None,
    ) -> tuple[list]:
        return _encode(parallel_model, prompt, text_encoder, vae, [image1, image2, image3], "edit_plus")
