"""Regenerate tests/data/comfy_regions_reference.json: ComfyUI 0.3.64's OWN area and mask conditioning nodes
(ConditioningSetArea, ConditioningSetAreaPercentage, ConditioningSetAreaStrength, ConditioningSetMask,
ConditioningSetTimestepRange, ConditioningCombine) + KSampler on the tiny Flux dev file of the KSampler reference.

Run by hand (not in CI) with a Python that imports ComfyUI (torch + ComfyUI's requirements), e.g.

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_regions_reference.py \
        --comfy /work/shared/ComfyUI

The model is ``comfy_ref_flux_dev.safetensors`` (written by make_comfy_ksampler_reference.py; read here, never
rewritten). Each case builds its positive and negative CONDITIONING with ComfyUI's nodes from stored text
tensors and stores, per entry, the options those nodes set (area, strength, mask, set_area_to_bounds,
timestep range), so the tests rebuild the same CONDITIONING. Nothing from this repository is imported.
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
JSON_NAME = "comfy_regions_reference.json"
MODEL_FILE = "comfy_ref_flux_dev.safetensors"
OPTION_KEYS = ("area", "strength", "mask", "mask_strength", "set_area_to_bounds", "start_percent", "end_percent")

CONVENTIONS = {
    "resolve": "samplers.py resolve_areas_and_cond_masks_multidim: percentage areas -> latent pixels, masks resized "
    "bilinearly to the latent, 'mask bounds' -> the mask's bounding box (at least 8 a side)",
    "pair": "samplers.py create_cond_with_same_area_if_none: each area gets a partner in the other branch",
    "weigh": "samplers.py get_area_and_mult + _calc_cond_batch: the window's prediction times mask*strength "
    "(areas without a mask feathered over 8 pixels at inner edges), divided by the summed weights",
}


def text(name: str, tokens: int) -> list:
    return [
        [
            randn(f"cond/{name}", (1, tokens, FLUX["context"])),
            {"pooled_output": randn(f"pooled/{name}", (1, FLUX["vec"]))},
        ]
    ]


def soft_mask(height: int, width: int) -> torch.Tensor:
    """A MASK at pixel size: a soft diagonal ramp, 0 in the top-left corner, 1 towards the bottom right."""
    ys = torch.linspace(0.0, 1.0, height).reshape(-1, 1)
    xs = torch.linspace(0.0, 1.0, width).reshape(1, -1)
    return ((ys + xs) - 0.6).clamp(0.0, 1.0)


def blob_mask(height: int, width: int) -> torch.Tensor:
    """A MASK at its own (other) size: a block of ones, for "mask bounds"."""
    m = torch.zeros(1, height, width)
    m[:, height // 4 : height * 3 // 4, width // 8 : width // 2] = 1.0
    return m


def cases(c) -> list[dict]:
    n = c.nodes
    sky, tree, river, base, neg, neg_corner = (text(k, t) for k, t in
        (("sky", 5), ("tree", 4), ("river", 5), ("base", 6), ("neg", 3), ("neg_corner", 3)))  # fmt: skip
    # 1: two prompts with areas (one of them weaker) + one with a soft mask, over a plain negative
    (left,) = n.ConditioningSetArea().append(sky, 48, 96, 0, 0, 1.0)  # width, height, x, y, strength (px)
    (right,) = n.ConditioningSetArea().append(tree, 64, 48, 64, 32, 0.8)
    (masked,) = n.ConditioningSetMask().append(river, soft_mask(96, 128), "default", 0.7)
    (two,) = n.ConditioningCombine().combine(left, right)
    (regional,) = n.ConditioningCombine().combine(two, masked)
    # 2: a percentage area, "mask bounds", a timestep range and a negative with an area of its own
    (half,) = n.ConditioningSetAreaPercentage().append(sky, 0.5, 1.0, 0.5, 0.0, 1.0)
    (bounded,) = n.ConditioningSetMask().append(tree, blob_mask(40, 56), "mask bounds", 1.0)
    (early,) = n.ConditioningSetTimestepRange().set_range(base, 0.0, 0.6)
    (weak,) = n.ConditioningSetAreaStrength().append(river, 0.5)
    (pos2,) = n.ConditioningCombine().combine(half, bounded)
    (pos2,) = n.ConditioningCombine().combine(pos2, early)
    (pos2,) = n.ConditioningCombine().combine(pos2, weak)
    (corner,) = n.ConditioningSetArea().append(neg_corner, 64, 64, 0, 32, 1.0)
    (neg2,) = n.ConditioningCombine().combine(neg, corner)
    base_settings = {"seed": 3, "steps": 3, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}
    return [
        {**base_settings, "name": "regions_areas_mask", "cfg": 2.0, "what": "two areas (one strength 0.8) and a soft "
         "mask (strength 0.7) over a plain negative", "positive": regional, "negative": neg},
        {**base_settings, "name": "regions_bounds_percentage", "cfg": 3.0, "what": "percentage area, mask bounds, "
         "timestep range, area strength; a negative area", "positive": pos2, "negative": neg2, "sampler_name": "heun"},
        {**base_settings, "name": "regions_cfg1", "cfg": 1.0, "what": "areas and mask at cfg 1",
         "positive": regional, "negative": neg},
    ]  # fmt: skip


def entry_record(name: str, entry: list, tensors: dict) -> dict:
    embeds, options = entry
    tensors[f"{name}.embeds"] = embeds
    tensors[f"{name}.pooled"] = options["pooled_output"]
    record = {}
    for key in OPTION_KEYS:
        if key not in options:
            continue
        value = options[key]
        if isinstance(value, torch.Tensor):
            tensors[f"{name}.{key}"] = value
            record[key] = f"{name}.{key}"
        else:
            record[key] = list(value) if isinstance(value, tuple) else value
    return record


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
        samples = randn("latent/regions", (1, 16, 12, 16))  # 128 x 96 px
        tensors["samples"] = samples
        for case in cases(c):
            name = case["name"]
            with torch.no_grad():
                (out,) = c.nodes.KSampler().sample(
                    model, case["seed"], case["steps"], case["cfg"], case["sampler_name"], case["scheduler"],
                    case["positive"], case["negative"], {"samples": samples}, denoise=case["denoise"],
                )  # fmt: skip
            record = {k: v for k, v in case.items() if k not in ("positive", "negative")}
            for role in ("positive", "negative"):
                record[role] = [entry_record(f"{name}.{role}.{i}", e, tensors) for i, e in enumerate(case[role])]
            tensors[f"{name}.expected"] = out["samples"]
            records.append(record)
            print(f"{name:28s} ok {tuple(out['samples'].shape)}")
        reference = {
            "generator": "tests/data/make_comfy_regions_reference.py",
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
