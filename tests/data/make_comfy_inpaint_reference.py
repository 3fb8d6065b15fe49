"""Regenerate tests/data/comfy_inpaint_reference.json: ComfyUI 0.3.64's OWN SetLatentNoiseMask + KSampler
(inpainting with a LATENT noise mask) on the tiny Flux dev file of the KSampler reference.

Run by hand (not in CI) with a Python that imports ComfyUI (torch + ComfyUI's requirements), e.g.

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_inpaint_reference.py \
        --comfy /work/shared/ComfyUI

The model is ``comfy_ref_flux_dev.safetensors`` (written by make_comfy_ksampler_reference.py; read here, never
rewritten), loaded through ComfyUI's real loading path with the same detection overrides (see that script).
Each case: text CONDITIONING (FluxGuidance where set), a non-zero image latent, a MASK given to
``SetLatentNoiseMask`` (at the image's pixel size, or another size: KSampler interpolates it), and
``nodes.KSampler`` with the case's settings. Nothing from this repository is imported.
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
from comfy_reference_models import FLUX, detection_overrides, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md (the snapshot has no .git)
JSON_NAME = "comfy_inpaint_reference.json"
MODEL_FILE = "comfy_ref_flux_dev.safetensors"

CONVENTIONS = {
    "set_mask": "nodes.py:1471 SetLatentNoiseMask: noise_mask = mask.reshape(-1, 1, H, W) (the MASK's own size)",
    "prepare_mask": (
        "samplers.py:994 outer_sample -> sampler_helpers.prepare_mask -> utils.py:1044 reshape_mask: bilinear "
        "interpolate to the latent's H x W, repeat over channels, repeat_to_batch_size (repeat, then cut)"
    ),
    "blend": (
        "samplers.py:402 KSamplerX0Inpaint: x = x*mask + scale_latent_inpaint(sigma, noise, latent)*(1-mask) "
        "before the model (model_base.py: noise_scaling of the start noise to sigma), out = out*mask + "
        "latent*(1-mask) after; the sampler's own state untouched; latent = process_latent_in(input)"
    ),
    "ddim": "samplers.py KSAMPLER.sample: inpaint_options random (ddim) -> the kept region's noise is a fresh draw seeded seed+1",
}


def text(name: str, tokens: int) -> list:
    return [
        [
            randn(f"cond/{name}", (1, tokens, FLUX["context"])),
            {"pooled_output": randn(f"pooled/{name}", (1, FLUX["vec"]))},
        ]
    ]


def window_mask(batch: int, height: int, width: int) -> torch.Tensor:
    """0 outside a window, 1 inside, a soft ramp on its left edge (values between 0 and 1 too)."""
    m = torch.zeros(batch, height, width)
    m[:, height // 4 : height - height // 8, width // 3 :] = 1.0
    ramp = torch.linspace(0.0, 1.0, width // 6 + 2)[1:-1]
    m[:, height // 4 : height - height // 8, width // 3 - ramp.numel() : width // 3] = ramp
    return m


def cases() -> list[dict]:
    pos, neg = text("inpaint_pos", 5), text("inpaint_neg", 3)
    image = randn("latent/inpaint_image", (1, 16, 8, 12))  # 96 x 64 px
    pair = randn("latent/inpaint_pair", (2, 16, 8, 12))
    base = {"seed": 5, "steps": 4, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}
    return [
        {**base, "name": "inpaint_euler", "what": "pixel-size mask [1,64,96], cfg 1",
         "positive": pos, "negative": neg, "samples": image, "mask": window_mask(1, 64, 96)},
        {**base, "name": "inpaint_cfg_denoise", "what": "2-D mask at 40x56 (interpolated), cfg 2.5, FluxGuidance 4, denoise 0.7",
         "positive": pos, "negative": neg, "samples": image, "mask": window_mask(1, 40, 56)[0], "cfg": 2.5,
         "guidance": 4.0, "denoise": 0.7},
        {**base, "name": "inpaint_ancestral_batch", "what": "batch 2 with one mask, euler_ancestral, cfg 2",
         "positive": pos, "negative": neg, "samples": pair, "mask": window_mask(1, 64, 96), "cfg": 2.0,
         "sampler_name": "euler_ancestral", "seed": 9},
        {**base, "name": "inpaint_ddim", "what": "ddim: the kept region re-noised with a seed+1 draw",
         "positive": pos, "negative": neg, "samples": image, "mask": window_mask(1, 64, 96).round(),
         "sampler_name": "ddim", "scheduler": "ddim_uniform", "steps": 3},
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        detection_overrides(c)
        model = c.comfy.sd.load_diffusion_model(str(HERE / MODEL_FILE), model_options={"dtype": torch.float32})
        tensors: dict[str, torch.Tensor] = {}
        records = []
        for case in cases():
            name = case["name"]
            positive, negative = case["positive"], case["negative"]
            if "guidance" in case:
                (positive,) = c.nodes_flux.FluxGuidance.execute(positive, case["guidance"]).result
            (latent,) = c.nodes.SetLatentNoiseMask().set_mask({"samples": case["samples"]}, case["mask"])
            with torch.no_grad():
                (out,) = c.nodes.KSampler().sample(
                    model, case["seed"], case["steps"], case["cfg"], case["sampler_name"], case["scheduler"],
                    positive, negative, latent, denoise=case["denoise"],
                )  # fmt: skip
            for role, cond in (("positive", case["positive"]), ("negative", negative)):
                tensors[f"{name}.{role}.embeds"] = cond[0][0]
                tensors[f"{name}.{role}.pooled"] = cond[0][1]["pooled_output"]
            tensors[f"{name}.samples"] = case["samples"]
            tensors[f"{name}.mask"] = case["mask"]
            tensors[f"{name}.expected"] = out["samples"]
            record = {k: v for k, v in case.items() if k not in ("positive", "negative", "samples", "mask")}
            record["noise_mask_shape"] = list(latent["noise_mask"].shape)
            records.append(record)
            print(f"{name:28s} ok {tuple(out['samples'].shape)}")
        reference = {
            "generator": "tests/data/make_comfy_inpaint_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "model": MODEL_FILE,
            "conventions": CONVENTIONS,
            "cases": records,
        }
    compact = ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(tensor_json(v), separators=(',', ':'))}" for k, v in sorted(tensors.items())
    )
    text_out = json.dumps(reference, indent=1)[:-2] + ',\n "tensors": {\n' + compact + "\n }\n}\n"
    json.loads(text_out)
    out = args.out / JSON_NAME
    out.write_text(text_out, encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
