"""Regenerate tests/data/comfy_fp8_mixed_reference.json and comfy_ref_flux_dev_fp8_mixed.safetensors with
ComfyUI's OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (tests/comfyui/comfy_env.py builds one):

    PYTHONDONTWRITEBYTECODE=1 <comfy venv>/bin/python tests/data/make_comfy_fp8_mixed_reference.py \
        --comfy /work/shared/ComfyUI

The file is the tiny Flux dev of make_comfy_ksampler_reference.py (comfy_reference_models.flux_state: ComfyUI's
own Flux module at tiny widths, deterministic values) saved in ComfyUI's "fp8 scaled" convention as some
published files are: the ``scaled_fp8`` marker; every Linear weight of the double and single blocks in
float8_e4m3fn with its float32 ``scale_weight`` (max|W| / 448); the Linear weights outside the blocks kept
in bf16, each with ``scale_weight`` = 1, except ``guidance_in.out_layer.weight``, kept in bf16 with no scale
at all; biases and norm scales in bf16. ComfyUI loads it with ``comfy.sd.load_diffusion_model`` (what
UNETLoader calls): the marker makes every Linear a scaled-fp8 layer whose parameters are fp8, so a bf16
weight (and every Linear bias) is rounded to fp8 as it is loaded. Its KSampler then samples it; the JSON
holds the conditioning, the settings, the samples and what ComfyUI's loaded model holds.

The detection override of make_comfy_ksampler_reference.py applies (ComfyUI's Flux detection hard-codes
the published widths). Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_reference_models import FLUX, detection_overrides, flux_state, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md (the snapshot has no .git)
FILE_NAME = "comfy_ref_flux_dev_fp8_mixed.safetensors"
JSON_NAME = "comfy_fp8_mixed_reference.json"
FP8_MAX = 448.0
UNSCALED = "guidance_in.out_layer.weight"  # bf16 with no scale_weight at all


def is_linear_weight(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(".weight") and tensor.ndim == 2


def in_block(name: str) -> bool:
    return name.startswith(("double_blocks.", "single_blocks."))


def mixed_fp8_scaled(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Block Linear weights fp8 + scale; the other Linear weights bf16 with scale 1 (one with none)."""
    out: dict[str, torch.Tensor] = {"scaled_fp8": torch.empty(0, dtype=torch.float8_e4m3fn)}
    for name, value in state.items():
        layer = name[: -len("weight")]
        if not is_linear_weight(name, value):
            out[name] = value.to(torch.bfloat16)
        elif in_block(name):
            w = value.float()
            scale = (w.abs().max() / FP8_MAX).clamp(min=1e-12)
            out[name] = (w / scale).to(torch.float8_e4m3fn)
            out[layer + "scale_weight"] = scale.reshape(())
        else:
            out[name] = value.to(torch.bfloat16)
            if name != UNSCALED:
                out[layer + "scale_weight"] = torch.ones((), dtype=torch.float32)
    return out


def text(name: str, tokens: int) -> list:
    emb = randn(f"fp8mixed/cond/{name}", (1, tokens, FLUX["context"]))
    pooled = randn(f"fp8mixed/pooled/{name}", (1, FLUX["vec"]))
    return [[emb, {"pooled_output": pooled}]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        overrides = detection_overrides(c)
        from safetensors.torch import save_file

        state = mixed_fp8_scaled(flux_state(c, guidance=True))
        path = args.out / FILE_NAME
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        model = c.comfy.sd.load_diffusion_model(str(path))
        diffusion = model.model.diffusion_model
        loaded = {
            "scaled_fp8": str(model.model.model_config.scaled_fp8),
            "img_in.weight": str(diffusion.img_in.weight.dtype),
            "img_in.bias": str(diffusion.img_in.bias.dtype),
            UNSCALED: str(diffusion.guidance_in.out_layer.weight.dtype),
            "double_blocks.0.img_attn.qkv.weight": str(diffusion.double_blocks[0].img_attn.qkv.weight.dtype),
            "manual_cast_dtype": str(model.model.manual_cast_dtype),
        }
        # what ComfyUI's model holds for a bf16 weight of scale 1: the bf16 values rounded to fp8
        rounded = diffusion.img_in.weight.detach().float()
        assert torch.equal(rounded, state["img_in.weight"].to(torch.float8_e4m3fn).float()), "not rounded to fp8?"
        assert not torch.equal(rounded, state["img_in.weight"].float()), "the rounding changed nothing"

        tensors: dict[str, torch.Tensor] = {}
        conds = {"pos": text("pos", 5), "neg": text("neg", 3)}
        for name, cond in conds.items():
            tensors[f"{name}.embeds"], tensors[f"{name}.pooled"] = cond[0][0], cond[0][1]["pooled_output"]
        base = {"seed": 7, "steps": 4, "denoise": 1.0, "width": 48, "height": 32}
        cases = [
            {**base, "name": "euler_cfg1", "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple"},
            {**base, "name": "dpmpp_2m_karras_cfg2", "cfg": 2.0, "sampler_name": "dpmpp_2m", "scheduler": "karras"},
        ]
        records = []
        for case in cases:
            (latent,) = c.nodes.EmptyLatentImage().generate(case["width"], case["height"], 1)
            with torch.no_grad():
                (out,) = c.nodes.KSampler().sample(
                    model,
                    case["seed"],
                    case["steps"],
                    case["cfg"],
                    case["sampler_name"],
                    case["scheduler"],
                    conds["pos"],
                    conds["neg"],
                    latent,
                    denoise=case["denoise"],
                )
            tensors[f"{case['name']}.samples"] = out["samples"]
            records.append({**case, "positive": "pos", "negative": "neg", "samples": f"{case['name']}.samples"})
            print(f"{case['name']}: samples {list(out['samples'].shape)} mean |x| {out['samples'].abs().mean():.4f}")
        reference = {
            "generator": "tests/data/make_comfy_fp8_mixed_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT},
            "torch": torch.__version__,
            "file": FILE_NAME,
            "structure": FLUX,
            "detection_overrides": overrides.get("flux", {}),
            "comfy_loaded": loaded,
            "cases": records,
            "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
        }
    out_path = args.out / JSON_NAME
    out_path.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path} and {path}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
