"""Regenerate the tiny Qwen-Image files and tests/data/comfy_qwen_image_reference.json with ComfyUI's OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (torch, safetensors, einops, ...):

    /work/comfy-venv/bin/python tests/data/make_comfy_qwen_image_reference.py [--comfy /work/shared/ComfyUI]

What it does, all on the CPU in float32 compute:
1. Builds ComfyUI's own ``comfy.ldm.qwen_image.model.QwenImageTransformer2DModel`` at tiny sizes and fills
   its tensors with seeded random values: the state dict is in the ORIGINAL layout (the names of
   ``qwen_image_*.safetensors`` in ComfyUI's models/diffusion_models). It is saved three ways:
   bf16, fp8 e4m3fn (every Linear weight cast to fp8, the rest bf16) and "fp8 scaled" (ComfyUI's
   ``scaled_fp8`` marker plus one float32 ``scale_weight`` per Linear; weight = fp8 * scale).
2. Loads each file with ComfyUI's real loader (``comfy.sd.load_diffusion_model``: detection, the
   scaled-fp8 marker, weight dtypes, ops), and runs ComfyUI's KSampler (``nodes.common_ksampler``:
   empty-latent fix to 5-D, seeded noise, model sampling from ``supported_models.QwenImage``, CFG)
   on fixed CONDITIONING of different text lengths (as the Qwen2.5-VL encoder gives them, its
   template tokens dropped). It also stores one direct forward of the diffusion model.

The only thing patched is width: ComfyUI's detection reads ``in_channels`` and the block count from
the weights and takes the head count, head width, text width and rotary split from the 20B
model's defaults, so the tiny widths are added to the detected config (``TINY_WIDTHS``). Nothing
from parallel_runtime is imported (only the sibling comfy_setup.py). Files are written next to this script.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402 (the sibling helper, found through this folder)

SEED = 20250807
TINY_WIDTHS = {  # the 20B model: 24 heads x 128, text width 3584, rope (16, 56, 56)
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "joint_attention_dim": 24,
    "axes_dims_rope": (4, 6, 6),
}
NUM_LAYERS = 3
LATENT_CHANNELS = 16  # Wan 2.1 latent (ComfyUI's latent_formats.Wan21), packed 2x2 -> in_channels 64
FILES = {
    "bf16": "tiny_qwen_image_bf16.safetensors",
    "fp8_e4m3fn": "tiny_qwen_image_fp8_e4m3fn.safetensors",
    "fp8_scaled": "tiny_qwen_image_fp8_e4m3fn_scaled.safetensors",
}
FP8_MAX = 448.0


def import_comfy(comfy_dir: Path) -> SimpleNamespace:
    stubbed = prepare_comfy(comfy_dir)
    import comfy.ldm.qwen_image.model as qwen
    import comfy.model_detection
    import comfy.model_management
    import comfy.ops
    import comfy.sd
    import comfy.utils

    import nodes

    return SimpleNamespace(
        qwen=qwen,
        detection=comfy.model_detection,
        mm=comfy.model_management,
        ops=comfy.ops,
        sd=comfy.sd,
        nodes=nodes,
        stubbed=stubbed,
    )


# -- the tiny model ---------------------------------------------------------------------------------
def tiny_state_dict(c: SimpleNamespace) -> dict[str, torch.Tensor]:
    """ComfyUI's Qwen-Image module tree at tiny sizes, filled with seeded values of a sensible scale:
    Linear weights ~ N(0, 1/fan_in), biases ~ N(0, 0.02^2), norm scales ~ 1 + N(0, 0.1^2)."""
    model = c.qwen.QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=LATENT_CHANNELS * 4,
        out_channels=LATENT_CHANNELS,
        num_layers=NUM_LAYERS,
        dtype=torch.float32,
        device="cpu",
        operations=c.ops.disable_weight_init,
        **TINY_WIDTHS,
    )
    gen = torch.Generator().manual_seed(SEED)
    out = {}
    for name, param in sorted(model.state_dict().items()):
        shape = tuple(param.shape)
        if name.endswith(".weight") and len(shape) == 2:
            value = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
        elif name.endswith(".weight"):  # RMSNorm scales
            value = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            value = 0.02 * torch.randn(shape, generator=gen)
        out[name] = value.to(torch.bfloat16)
    return out


def is_linear_weight(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(".weight") and tensor.ndim == 2


def fp8_variant(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every Linear weight cast to float8_e4m3fn (as plain fp8 files store them), the rest as is."""
    return {k: v.to(torch.float8_e4m3fn) if is_linear_weight(k, v) else v for k, v in state.items()}


def fp8_scaled_variant(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ComfyUI's "fp8 scaled" layout: ``scaled_fp8`` marker, Linear weights W / s in fp8 with
    ``<layer>.scale_weight`` = s = max|W| / 448 (float32 scalar)."""
    out: dict[str, torch.Tensor] = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for k, v in state.items():
        if is_linear_weight(k, v):
            w = v.float()
            scale = (w.abs().max() / FP8_MAX).clamp(min=1e-12)
            out[k] = (w / scale).to(torch.float8_e4m3fn)
            out[k[: -len("weight")] + "scale_weight"] = scale.reshape(())
        else:
            out[k] = v
    return out


def save(state: dict[str, torch.Tensor], path: Path) -> str:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- running ComfyUI ----------------------------------------------------------------------------------
def load_with_comfy(c: SimpleNamespace, path: Path):
    """comfy.sd.load_diffusion_model with the tiny widths added to what detection reads."""
    real_detect = c.detection.detect_unet_config

    def detect(state_dict, key_prefix, metadata=None):
        config = real_detect(state_dict, key_prefix, metadata=metadata)
        if config is not None and config.get("image_model") == "qwen_image":
            config = {**config, **TINY_WIDTHS, "axes_dims_rope": list(TINY_WIDTHS["axes_dims_rope"])}
        return config

    with mock.patch.object(c.detection, "detect_unet_config", detect):
        return c.sd.load_diffusion_model(str(path))


def conditioning(gen: torch.Generator, tokens: int) -> torch.Tensor:
    return torch.randn(1, tokens, TINY_WIDTHS["joint_attention_dim"], generator=gen)


def run_case(c: SimpleNamespace, patcher, case: dict, conds: dict[str, torch.Tensor]) -> torch.Tensor:
    positive = [[conds[case["positive"]], {}]]
    negative = [[conds[case["negative"]], {}]]
    latent = (
        {"samples": torch.zeros(case["latent_shape"])} if case.get("latent") is None else {"samples": case["latent"]}
    )
    (out,) = c.nodes.common_ksampler(
        patcher,
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler"],
        case["scheduler"],
        positive,
        negative,
        latent,
        denoise=case["denoise"],
    )
    return out["samples"]


def direct_forward(patcher, x: torch.Tensor, sigma: float, context: torch.Tensor) -> torch.Tensor:
    """One call of the diffusion model (BaseModel.apply_model: latent format, model sampling, forward)."""
    model = patcher.model
    t = torch.tensor([sigma], dtype=torch.float32)
    with torch.no_grad():
        return model.apply_model(x, t, c_crossattn=context).float()


def comfy_commit(comfy_dir: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(comfy_dir), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "a125cd84b054a57729b5eecab930ca9408719832"  # the snapshot in /work/shared (COMFYUI.md)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    comfy_dir = args.comfy.resolve()
    torch.manual_seed(0)
    c = import_comfy(comfy_dir)

    state = tiny_state_dict(c)
    variants = {"bf16": state, "fp8_e4m3fn": fp8_variant(state), "fp8_scaled": fp8_scaled_variant(state)}
    files = {}
    for name, sd in variants.items():
        path = HERE / FILES[name]
        files[name] = {"file": FILES[name], "sha256": save(sd, path), "bytes": path.stat().st_size}

    gen = torch.Generator().manual_seed(SEED + 1)
    conds = {"pos7": conditioning(gen, 7), "neg5": conditioning(gen, 5), "pos4": conditioning(gen, 4)}
    img2img_latent = torch.randn(1, LATENT_CHANNELS, 1, 8, 8, generator=gen) * 0.5
    base = {"seed": 7, "steps": 4, "denoise": 1.0, "positive": "pos7", "negative": "neg5"}
    cases = [
        {**base, "name": "euler_cfg", "file": "bf16", "latent_shape": [1, 16, 8, 12], "cfg": 2.5,
         "sampler": "euler", "scheduler": "simple"},
        {**base, "name": "dpmpp_2m_karras_no_cfg_odd_grid", "file": "bf16", "latent_shape": [1, 16, 10, 6],
         "cfg": 1.0, "sampler": "dpmpp_2m", "scheduler": "karras", "positive": "pos4"},
        {**base, "name": "img2img_denoise", "file": "bf16", "latent_shape": [1, 16, 1, 8, 8], "cfg": 2.0,
         "sampler": "euler_ancestral", "scheduler": "normal", "denoise": 0.6, "latent": img2img_latent, "seed": 11},
        {**base, "name": "fp8_euler_cfg", "file": "fp8_e4m3fn", "latent_shape": [1, 16, 8, 12], "cfg": 2.5,
         "sampler": "euler", "scheduler": "simple"},
        {**base, "name": "fp8_scaled_euler_cfg", "file": "fp8_scaled", "latent_shape": [1, 16, 8, 12], "cfg": 2.5,
         "sampler": "euler", "scheduler": "simple"},
    ]  # fmt: skip

    patchers, loaded = {}, {}
    for name in FILES:
        patcher = load_with_comfy(c, HERE / FILES[name])
        patchers[name] = patcher
        diffusion = patcher.model.diffusion_model
        ms = patcher.model.model_sampling
        loaded[name] = {
            "model_class": type(patcher.model).__name__,
            "model_sampling": type(ms).__name__,
            "shift": float(ms.shift),
            "latent_format": type(patcher.model.latent_format).__name__,
            "scaled_fp8": str(patcher.model.model_config.scaled_fp8),
            "img_in_weight_dtype": str(diffusion.img_in.weight.dtype),
            "block0_to_q_weight_dtype": str(diffusion.transformer_blocks[0].attn.to_q.weight.dtype),
            "manual_cast_dtype": str(patcher.model.manual_cast_dtype),
        }

    results = []
    for case in cases:
        samples = run_case(c, patchers[case["file"]], case, conds)
        entry = {k: v for k, v in case.items() if k != "latent"}
        if case.get("latent") is not None:
            entry["latent"] = tensor_json(case["latent"])
        entry["samples"] = tensor_json(samples)
        results.append(entry)
        print(f"{case['name']}: samples {list(samples.shape)} mean |x| {samples.abs().mean():.4f}")

    gen = torch.Generator().manual_seed(SEED + 2)
    x = torch.randn(1, LATENT_CHANNELS, 1, 8, 12, generator=gen)
    forwards = []
    for name in FILES:
        out = direct_forward(patchers[name], x, 0.7, conds["pos7"])
        forwards.append({"file": name, "sigma": 0.7, "context": "pos7", "output": tensor_json(out)})

    reference = {
        "generator": "tests/data/make_comfy_qwen_image_reference.py",
        "comfyui_commit": comfy_commit(comfy_dir),
        "torch": torch.__version__,
        "stubbed_imports": c.stubbed,
        "config": {
            "patch_size": 2,
            "in_channels": LATENT_CHANNELS * 4,
            "out_channels": LATENT_CHANNELS,
            "num_layers": NUM_LAYERS,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in TINY_WIDTHS.items()},
        },
        "files": files,
        "comfy_loaded": loaded,
        "conditioning": {k: tensor_json(v) for k, v in conds.items()},
        "cases": results,
        "direct_forward": {"x": tensor_json(x), "runs": forwards},
    }
    out_path = HERE / "comfy_qwen_image_reference.json"
    out_path.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes) and {', '.join(FILES.values())}")


if __name__ == "__main__":
    main()
