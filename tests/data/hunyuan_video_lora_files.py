"""LoRA files for the tiny HunyuanVideo transformer (``hunyuan_video_tiny_weights``), in the formats ComfyUI 0.3.64
reads for HunyuanVideo: its own / musubi-tuner's converted ``diffusion_model.<Tencent name>`` (lora_A / lora_B),
diffusion-pipe's ``transformer.<Tencent name>``, and kohya's ``lora_unet_<ComfyUI's module name>`` with alpha
(ComfyUI names HunyuanVideo's modules its own way: ``img_mod.lin``, ``img_mlp.0``, ``img_attn.qkv``...).

Shared by ``make_comfy_hunyuan_video_lora_reference.py`` (ComfyUI's venv) and the tests: torch only, every value a
function of its name (``lora_files.uniform``).
"""

from __future__ import annotations

import torch
from hunyuan_video_tiny_weights import TinyHunyuanVideo, original_shapes
from lora_files import lora

D = TinyHunyuanVideo().width
# (Tencent name, the same module as ComfyUI's HunyuanVideo names it) of what the files patch
MODULES = {
    "double_blocks.0.img_attn_qkv": "double_blocks.0.img_attn.qkv",
    "double_blocks.0.txt_attn_proj": "double_blocks.0.txt_attn.proj",
    "double_blocks.0.img_mlp.fc1": "double_blocks.0.img_mlp.0",
    "double_blocks.0.txt_mlp.fc2": "double_blocks.0.txt_mlp.2",
    "double_blocks.0.txt_mod.linear": "double_blocks.0.txt_mod.lin",
    "single_blocks.0.linear1": "single_blocks.0.linear1",
    "single_blocks.0.linear2": "single_blocks.0.linear2",
    "single_blocks.0.modulation.linear": "single_blocks.0.modulation.lin",
    "txt_in.individual_token_refiner.blocks.0.self_attn_qkv": "txt_in.individual_token_refiner.blocks.0.self_attn.qkv",
    "final_layer.linear": "final_layer.linear",
}
COMFY = tuple(MODULES)
DIFFUSION_PIPE = ("double_blocks.0.img_attn_qkv", "double_blocks.0.txt_mlp.fc2", "single_blocks.0.linear1")
KOHYA = ("double_blocks.0.img_attn_qkv", "double_blocks.0.img_mlp.fc1", "double_blocks.0.txt_mod.linear",
         "single_blocks.0.linear1", "single_blocks.0.modulation.linear")  # fmt: skip
# case -> (file stem, strength) applied in order, as chained LoraLoaderModelOnly nodes
CASES = {
    "comfy": [("hunyuan_comfy", 1.0)],
    "diffusion_pipe": [("hunyuan_diffusion_pipe", 0.8)],
    "kohya": [("hunyuan_kohya", 0.7)],
    "stack": [("hunyuan_comfy", 0.6), ("hunyuan_kohya", -0.5)],
}


def _shape(name: str) -> tuple[int, ...]:
    return original_shapes(TinyHunyuanVideo())[f"{name}.weight"][0]


def hunyuan_lora_files() -> dict[str, dict[str, torch.Tensor]]:
    """File stem -> LoRA state dict."""
    return {
        "hunyuan_comfy": lora({f"diffusion_model.{m}": _shape(m) for m in COMFY}, "lora_B.weight", "lora_A.weight"),
        "hunyuan_diffusion_pipe": lora(
            {f"transformer.{m}": _shape(m) for m in DIFFUSION_PIPE}, "lora_B.weight", "lora_A.weight"
        ),
        "hunyuan_kohya": lora(
            {"lora_unet_" + MODULES[m].replace(".", "_"): _shape(m) for m in KOHYA},
            "lora_up.weight",
            "lora_down.weight",
            alpha=2.0,
        ),
    }
