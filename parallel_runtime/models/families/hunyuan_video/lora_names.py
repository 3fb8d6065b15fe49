"""The LoRA module names HunyuanVideo files use beyond ``diffusion_model.<Tencent name>`` and kohya's
``lora_unet_<Tencent name>`` (which every original layout gets): diffusion-pipe's ``transformer.<Tencent name>``,
and ComfyUI's own names of the modules (ComfyUI 0.3.64 renames Tencent's tensors on load: ``img_mod.lin``,
``img_attn.qkv``, ``img_mlp.0``, ``time_in.in_layer``...) in the ``diffusion_model.`` and kohya forms its LoRA
loader accepts for every model.
"""

from __future__ import annotations

# (Tencent's name fragment, ComfyUI's) at module-name boundaries: the names ComfyUI's HunyuanVideo model has
COMFY_NAMES = (
    ("_mod.linear.", "_mod.lin."),
    (".modulation.linear.", ".modulation.lin."),
    ("_attn_qkv.", "_attn.qkv."),
    ("_attn_proj.", "_attn.proj."),
    ("mlp.fc1.", "mlp.0."),
    ("mlp.fc2.", "mlp.2."),
    ("t_embedder.mlp.0.", "t_embedder.in_layer."),
    ("t_embedder.mlp.2.", "t_embedder.out_layer."),
    ("c_embedder.linear_1.", "c_embedder.in_layer."),
    ("c_embedder.linear_2.", "c_embedder.out_layer."),
    ("_in.mlp.0.", "_in.in_layer."),  # time_in, guidance_in
    ("_in.mlp.2.", "_in.out_layer."),
)


def comfy_name(module: str) -> str:
    """ComfyUI's name of the Tencent-layout module ``module``, e.g. double_blocks.0.img_mod.linear -> ...img_mod.lin."""
    name = module + "."
    for tencent, comfy in COMFY_NAMES:
        name = name.replace(tencent, comfy)
    return name[:-1]


def lora_aliases(module: str) -> tuple[str, ...]:
    """More LoRA module names that patch the Tencent-layout ``module`` (see the module doc)."""
    comfy = comfy_name(module)
    return f"transformer.{module}", f"diffusion_model.{comfy}", "lora_unet_" + comfy.replace(".", "_")
