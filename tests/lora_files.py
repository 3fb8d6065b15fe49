"""Tiny original-layout transformers and LoRA files in the formats artists have (test fixtures).

Shared by ``tests/data/make_comfy_lora_reference.py`` (run with ComfyUI's venv, which has no
diffusers) and the tests, so it imports only torch and safetensors. Every tensor is a pure
function of its name and shape (integer hashing, no RNG state), so both sides build the same
bytes on any machine and torch version.

Formats (per family): kohya / sd-scripts ``lora_unet_*`` with ``alpha``; ComfyUI's own
``diffusion_model.*`` (lora_up/lora_down, as its LoRA-extract node writes); diffusers/PEFT
``transformer.*`` (lora_A/lora_B); AI-Toolkit (``transformer.*`` with lora_down/lora_up and alpha);
OneTrainer ``lora_transformer_*``; XLabs ``*.processor.*`` (Flux); LyCORIS LoKr and LoHa under
kohya names; full diff (``.diff`` / ``.diff_b``); DoRA (``dora_scale``). Text-encoder keys ride
along in the kohya and PEFT files (``lora_te1_*``, ``text_encoder.*``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence

import torch

_MOD = 1 << 32
Shape = Sequence[int]
StateDict = dict[str, torch.Tensor]


# -- deterministic values ------------------------------------------------------------------------
def uniform(name: str, shape: Shape) -> torch.Tensor:
    """Values in [-1, 1) that depend only on ``name`` and ``shape`` (float32)."""
    n = math.prod(shape)
    i = torch.arange(n, dtype=torch.int64)
    x = (i * 2654435761 + zlib.crc32(name.encode())) % _MOD
    x = ((x ^ (x >> 15)) * 73244475) % _MOD
    x = ((x ^ (x >> 13)) * 73244475) % _MOD
    x = x ^ (x >> 16)
    return (x.double() / _MOD * 2.0 - 1.0).float().reshape(tuple(shape))


def base_value(name: str, shape: Shape) -> torch.Tensor:
    """A plausible weight: norm scales near 1, biases small, matrices ~ 1/sqrt(fan_in)."""
    u = uniform(name, shape)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "scale" or ".ln_" in name or (".norm" in name and leaf == "weight" and len(shape) == 1):
        return 1.0 + 0.1 * u
    if len(shape) == 1:
        return 0.05 * u
    if name.endswith("pos_embed"):
        return 0.5 * u
    return u / math.sqrt(math.prod(shape[1:]))


def base_state_dict(skeleton: Mapping[str, Shape]) -> StateDict:
    """The tiny transformer of ``skeleton`` (original-layout names -> shapes)."""
    return {name: base_value(name, shape) for name, shape in skeleton.items()}


def write_model(skeleton: Mapping[str, Shape], path: str) -> str:
    """Save the tiny transformer of ``skeleton`` as a single original-layout file at ``path``."""
    from safetensors.torch import save_file

    save_file(base_state_dict(skeleton), path)
    return path


def conditioning(name: str, tokens: int, width: int, pooled: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt embeddings [1, tokens, width], pooled [1, pooled]) for a fixed ``name``."""
    return uniform(name + ".cond", (1, tokens, width)), uniform(name + ".pooled", (1, pooled))


# -- the tiny models (ComfyUI-side configs; the oracle script stores their skeletons) ------------
FLUX_CONFIG = {
    "image_model": "flux",
    "in_channels": 16,
    "patch_size": 2,
    "out_channels": 16,
    "vec_in_dim": 32,
    "context_in_dim": 32,
    "hidden_size": 64,
    "mlp_ratio": 4.0,
    "num_heads": 4,
    "depth": 2,
    "depth_single_blocks": 2,
    "axes_dim": [4, 6, 6],
    "theta": 10000,
    "qkv_bias": True,
    "guidance_embed": True,
}
SD3_CONFIG = {  # ComfyUI's MMDiT: hidden = 64 * depth, heads = depth (head width 64)
    "depth": 2,
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "adm_in_channels": 80,
    "context_in_dim": 96,
    "pos_embed_max_size": 16,
    "qk_norm": "rms",
    "x_block_self_attn_layers": [0],
}
# Text encoders of the tiny pipelines (parallel_runtime's tiny factory uses the same sizes).
TEXT_ENCODERS = {
    "flux": {"clip_l": ("clip", 32, 2), "t5xxl": ("t5", 32, 2)},
    "sd3": {"clip_l": ("clip", 32, 2), "clip_g": ("clip", 48, 2), "t5xxl": ("t5", 96, 2)},
}


# -- LoRA building blocks ------------------------------------------------------------------------
def _factors(name: str, out_shape: Shape, rank: int, up: str, down: str) -> StateDict:
    """Low-rank factors for a weight of ``out_shape`` ([out, in] or a conv [out, in, k, k])."""
    out_features, rest = out_shape[0], tuple(out_shape[1:])
    conv = len(rest) > 1
    down_shape = (rank, *rest)
    up_shape = (out_features, rank, 1, 1) if conv else (out_features, rank)
    return {
        f"{name}.{down}": 0.2 * uniform(f"{name}.{down}", down_shape),
        f"{name}.{up}": 0.2 * uniform(f"{name}.{up}", up_shape),
    }


def lora(targets: Mapping[str, Shape], up: str, down: str, rank: int = 4, alpha: float | None = None) -> StateDict:
    out: StateDict = {}
    for name, shape in targets.items():
        out.update(_factors(name, shape, rank, up, down))
        if alpha is not None:
            out[f"{name}.alpha"] = torch.tensor(alpha)
    return out


def lokr(name: str, w1: Shape | None, w1_ab: tuple[Shape, Shape] | None, w2: Shape | None,
         w2_ab: tuple[Shape, Shape] | None, alpha: float | None) -> StateDict:  # fmt: skip
    """LyCORIS LoKr: kron(w1, w2), each factor full or a low-rank product (a @ b)."""
    out: StateDict = {}
    for label, full, ab in (("w1", w1, w1_ab), ("w2", w2, w2_ab)):
        if full is not None:
            out[f"{name}.lokr_{label}"] = 0.5 * uniform(f"{name}.lokr_{label}", full)
        else:
            out[f"{name}.lokr_{label}_a"] = 0.5 * uniform(f"{name}.lokr_{label}_a", ab[0])
            out[f"{name}.lokr_{label}_b"] = 0.5 * uniform(f"{name}.lokr_{label}_b", ab[1])
    if alpha is not None:
        out[f"{name}.alpha"] = torch.tensor(alpha)
    return out


def loha(name: str, shape: Shape, rank: int, alpha: float) -> StateDict:
    """LyCORIS LoHa: (w1_a @ w1_b) * (w2_a @ w2_b)."""
    out = {f"{name}.alpha": torch.tensor(alpha)}
    for part, dims in (("w1_a", (shape[0], rank)), ("w1_b", (rank, shape[1])), ("w2_a", (shape[0], rank)),
                       ("w2_b", (rank, shape[1]))):  # fmt: skip
        out[f"{name}.hada_{part}"] = 0.6 * uniform(f"{name}.hada_{part}", dims)
    return out


def diff(name: str, shape: Shape, bias: int | None) -> StateDict:
    """A full-difference patch (ComfyUI's LoRA-extract "full diff"), optionally with a bias diff."""
    out = {f"{name}.diff": 0.05 * uniform(f"{name}.diff", shape)}
    if bias is not None:
        out[f"{name}.diff_b"] = 0.05 * uniform(f"{name}.diff_b", (bias,))
    return out


def kohya(original: str) -> str:
    return "lora_unet_" + original.replace(".", "_")


# -- the files, per family -----------------------------------------------------------------------
def _flux_files() -> dict[str, StateDict]:
    h, mlp, head = 64, 256, 16
    te_kohya = lora(
        {
            "lora_te1_text_model_encoder_layers_0_self_attn_q_proj": (32, 32),
            "lora_te1_text_model_encoder_layers_1_mlp_fc1": (64, 32),
        },  # fmt: skip
        "lora_up.weight",
        "lora_down.weight",
        alpha=2.0,
    )
    te_peft = lora(
        {"text_encoder.text_model.encoder.layers.1.self_attn.v_proj": (32, 32)}, "lora_B.weight", "lora_A.weight"
    )
    kohya_targets = {
        "double_blocks.0.img_attn.qkv": (3 * h, h),
        "double_blocks.1.txt_mod.lin": (6 * h, h),
        "double_blocks.0.img_mlp.0": (mlp, h),
        "single_blocks.0.linear1": (3 * h + mlp, h),
        "single_blocks.1.linear2": (h, h + mlp),
        "final_layer.adaLN_modulation.1": (2 * h, h),
        "txt_in": (h, 32),
        "time_in.in_layer": (h, 256),
    }
    comfy_targets = {
        "double_blocks.1.img_attn.proj": (h, h),
        "single_blocks.1.linear1": (3 * h + mlp, h),
        "double_blocks.0.txt_attn.qkv": (3 * h, h),
        "vector_in.in_layer": (h, 32),
        "guidance_in.out_layer": (h, h),
        "img_in": (h, 64),
        "single_blocks.0.modulation.lin": (3 * h, h),
    }
    peft_targets = {
        "transformer_blocks.0.attn.to_q": (h, h),
        "transformer_blocks.0.attn.to_k": (h, h),
        "transformer_blocks.1.attn.add_v_proj": (h, h),
        "single_transformer_blocks.0.proj_mlp": (mlp, h),
        "single_transformer_blocks.1.attn.to_v": (h, h),
        "norm_out.linear": (2 * h, h),
        "proj_out": (64, h),
        "x_embedder": (h, 64),
        "context_embedder": (h, 32),
        "transformer_blocks.0.ff_context.net.2": (h, mlp),
        "time_text_embed.guidance_embedder.linear_1": (h, 256),
        "single_transformer_blocks.0.norm.linear": (3 * h, h),
    }
    aitk_targets = {
        "transformer_blocks.1.attn.to_out.0": (h, h),
        "transformer_blocks.1.ff.net.0.proj": (mlp, h),
        "single_transformer_blocks.1.proj_out": (h, h + mlp),
        "transformer_blocks.0.norm1_context.linear": (6 * h, h),
    }
    onetrainer_targets = {
        "lora_transformer_transformer_blocks_0_attn_to_v": (h, h),
        "lora_transformer_single_transformer_blocks_1_attn_to_q": (h, h),
        "lora_transformer_time_text_embed_timestep_embedder_linear_2": (h, h),
    }
    xlabs: StateDict = {}
    for block in (0, 1):
        for proc, shape in (("qkv_lora1", (3 * h, h)), ("proj_lora1", (h, h)), ("qkv_lora2", (3 * h, h)),
                            ("proj_lora2", (h, h))):  # fmt: skip
            xlabs.update(_factors(f"double_blocks.{block}.processor.{proc}", shape, 4, "up.weight", "down.weight"))
    for proc, shape in (("qkv_lora", (3 * h, h)), ("proj_lora", (h, h + mlp))):
        xlabs.update(_factors(f"single_blocks.0.processor.{proc}", shape, 4, "up.weight", "down.weight"))
    lokr_sd = {
        **lokr(kohya("double_blocks.0.img_attn.qkv"), (4, 4), None, None, ((48, 2), (2, 16)), 1.0),
        **lokr(kohya("single_blocks.0.linear2"), (4, 8), None, (16, 40), None, None),
        **lokr(kohya("double_blocks.1.img_mod.lin"), None, ((8, 2), (2, 4)), (48, 16), None, 4.0),
    }
    loha_sd = {
        **loha(kohya("double_blocks.1.img_mlp.2"), (h, mlp), 4, 2.0),
        **loha(kohya("single_blocks.1.linear1"), (3 * h + mlp, h), 2, 1.0),
    }
    diff_sd = {
        **diff("diffusion_model.double_blocks.0.img_attn.proj", (h, h), h),
        **diff("diffusion_model.single_blocks.0.linear1", (3 * h + mlp, h), 3 * h + mlp),
        **diff("diffusion_model.final_layer.adaLN_modulation.1", (2 * h, h), 2 * h),
        **diff("diffusion_model.double_blocks.0.img_attn.norm.query_norm.scale", (head,), None),
    }
    dora_sd = lora({kohya("double_blocks.1.img_attn.qkv"): (3 * h, h), kohya("double_blocks.0.img_mlp.2"): (h, mlp)},
                   "lora_up.weight", "lora_down.weight", alpha=4.0)  # fmt: skip
    dora_sd[kohya("double_blocks.1.img_attn.qkv") + ".dora_scale"] = 0.9 + 0.2 * uniform("dora.in", (1, h))
    dora_sd[kohya("double_blocks.0.img_mlp.2") + ".dora_scale"] = 0.5 + 0.2 * uniform("dora.out", (h, 1))
    return {
        "flux_kohya": {
            **lora({kohya(k): s for k, s in kohya_targets.items()}, "lora_up.weight", "lora_down.weight", alpha=2.0),
            **te_kohya,
        },  # fmt: skip
        "flux_comfy": lora(
            {"diffusion_model." + k: s for k, s in comfy_targets.items()}, "lora_up.weight", "lora_down.weight"
        ),  # fmt: skip
        "flux_peft": {
            **lora({"transformer." + k: s for k, s in peft_targets.items()}, "lora_B.weight", "lora_A.weight"),
            **te_peft,
        },  # fmt: skip
        "flux_aitoolkit": lora(
            {"transformer." + k: s for k, s in aitk_targets.items()}, "lora_up.weight", "lora_down.weight", alpha=8.0
        ),  # fmt: skip
        "flux_onetrainer": lora(onetrainer_targets, "lora_up.weight", "lora_down.weight", alpha=8.0),
        "flux_xlabs": xlabs,
        "flux_lokr": lokr_sd,
        "flux_loha": loha_sd,
        "flux_diff": diff_sd,
        "flux_dora": dora_sd,
    }


def _sd3_files() -> dict[str, StateDict]:
    h, mlp = 128, 512
    kohya_targets = {
        "joint_blocks.0.x_block.attn.qkv": (3 * h, h),
        "joint_blocks.0.context_block.mlp.fc1": (mlp, h),
        "joint_blocks.1.x_block.adaLN_modulation.1": (6 * h, h),
        "joint_blocks.1.context_block.adaLN_modulation.1": (2 * h, h),
        "joint_blocks.0.x_block.attn2.qkv": (3 * h, h),
        "final_layer.adaLN_modulation.1": (2 * h, h),
        "context_embedder": (h, 96),
        "y_embedder.mlp.0": (h, 80),
        "x_embedder.proj": (h, 16, 2, 2),
    }
    te_kohya = lora(
        {
            "lora_te1_text_model_encoder_layers_0_self_attn_k_proj": (32, 32),
            "lora_te2_text_model_encoder_layers_1_mlp_fc2": (48, 96),
            "lora_te3_encoder_block_0_layer_0_SelfAttention_q": (32, 96),
        },  # fmt: skip
        "lora_up.weight",
        "lora_down.weight",
        alpha=1.0,
    )
    peft_targets = {
        "transformer_blocks.0.attn.to_q": (h, h),
        "transformer_blocks.0.attn.add_k_proj": (h, h),
        "transformer_blocks.0.attn2.to_v": (h, h),
        "transformer_blocks.1.ff.net.0.proj": (mlp, h),
        "transformer_blocks.1.norm1_context.linear": (2 * h, h),
        "norm_out.linear": (2 * h, h),
        "proj_out": (64, h),
        "pos_embed.proj": (h, 16, 2, 2),
        "time_text_embed.text_embedder.linear_2": (h, h),
    }
    te_peft = lora(
        {"text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj": (48, 48)}, "lora_B.weight", "lora_A.weight"
    )
    comfy_targets = {
        "joint_blocks.1.x_block.attn.proj": (h, h),
        "joint_blocks.0.context_block.attn.qkv": (3 * h, h),
        "t_embedder.mlp.2": (h, h),
        "joint_blocks.0.x_block.attn2.proj": (h, h),
    }
    onetrainer_targets = {
        "lora_transformer_transformer_blocks_1_attn_to_k": (h, h),
        "lora_transformer_transformer_blocks_0_ff_context_net_2": (h, mlp),
    }
    lokr_sd = lokr(kohya("joint_blocks.1.x_block.attn.qkv"), (4, 4), None, None, ((96, 2), (2, 32)), 1.0)
    loha_sd = loha(kohya("joint_blocks.0.x_block.mlp.fc2"), (h, mlp), 4, 2.0)
    diff_sd = {
        **diff("diffusion_model.joint_blocks.1.context_block.adaLN_modulation.1", (2 * h, h), 2 * h),
        **diff("diffusion_model.joint_blocks.0.x_block.attn.ln_q", (64,), None),
        **diff("diffusion_model.joint_blocks.1.x_block.attn.qkv", (3 * h, h), 3 * h),
    }
    return {
        "sd3_kohya": {
            **lora({kohya(k): s for k, s in kohya_targets.items()}, "lora_up.weight", "lora_down.weight", alpha=2.0),
            **te_kohya,
        },  # fmt: skip
        "sd3_peft": {
            **lora({"transformer." + k: s for k, s in peft_targets.items()}, "lora_B.weight", "lora_A.weight"),
            **te_peft,
        },  # fmt: skip
        "sd3_comfy": lora(
            {"diffusion_model." + k: s for k, s in comfy_targets.items()}, "lora_up.weight", "lora_down.weight"
        ),  # fmt: skip
        "sd3_onetrainer": lora(onetrainer_targets, "lora_up.weight", "lora_down.weight", alpha=8.0),
        "sd3_lokr": lokr_sd,
        "sd3_loha": loha_sd,
        "sd3_diff": diff_sd,
    }


LORA_FILES: dict[str, Callable[[], dict[str, StateDict]]] = {"flux": _flux_files, "sd3": _sd3_files}
FORMATS = {  # file stem -> the format it stands for (what the tests print)
    "kohya": "kohya / sd-scripts (lora_unet_*, alpha)",
    "comfy": "ComfyUI / original layout (diffusion_model.*)",
    "peft": "diffusers / PEFT (transformer.*, lora_A/lora_B)",
    "aitoolkit": "AI-Toolkit (transformer.*, lora_down/lora_up, alpha)",
    "onetrainer": "OneTrainer (lora_transformer_*)",
    "xlabs": "XLabs (*.processor.*)",
    "lokr": "LyCORIS LoKr",
    "loha": "LyCORIS LoHa",
    "diff": "full diff (.diff / .diff_b)",
    "dora": "DoRA (dora_scale)",
}


def lora_files(family: str) -> dict[str, StateDict]:
    """Every LoRA file of ``family``: stem (e.g. "flux_kohya") -> state dict."""
    return LORA_FILES[family]()
