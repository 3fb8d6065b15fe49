"""Regenerate tests/data/comfy_fill_reference.json: ComfyUI 0.3.64's OWN InpaintModelConditioning + KSampler on a
tiny FLUX.1 Fill-structure file (UNETLoader's loading path).

Run by hand (not in CI) with a Python that imports ComfyUI (torch + ComfyUI's requirements), e.g.

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_fill_reference.py --comfy /work/shared/ComfyUI

The Fill file is the tiny Flux dev file of the KSampler reference (``comfy_ref_flux_dev.safetensors``) with
``img_in.weight`` made 384 features wide (16 latent + 16 image + 64 mask channels per latent pixel, 2x2 packed):
ComfyUI's own ``comfy.ldm.flux.model.Flux(in_channels=96)`` structure, every other tensor the dev file's (the
values are seeded by name and shape). It is written to a temporary folder and loaded with
``comfy.sd.load_diffusion_model`` (what UNETLoader calls), which detects it as ``FluxInpaint``; the test builds
the same file (the JSON records img_in's checksum). The VAE given to InpaintModelConditioning is a stand-in (a
fixed linear map of each 8x8 pixel block to 16 channels): the node's own mask interpolation, pixel greying and
noise mask run for real, and the test takes the node's outputs (CONDITIONING and LATENT) as stored here.
Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_reference_models import FLUX, detection_overrides, fill_state, flux_state, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md (the snapshot has no .git)
JSON_NAME = "comfy_fill_reference.json"
DEV_FILE = "comfy_ref_flux_dev.safetensors"
SIZES = ((64, 48), (72, 56))  # pixels (height, width): 8 x 6 and 9 x 7 latent pixels
FILL_IN = 96 * 4  # Fill's img_in features: (16 + 16 + 64) channels x 2x2


class StandInVAE:
    """What InpaintModelConditioning calls: ``encode(pixels [B,H,W,3]) -> latent [B,16,H/8,W/8]``."""

    def __init__(self) -> None:
        self.weight = randn("fill/vae", (16, 3 * 64), 1.0 / math.sqrt(3 * 64))

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        blocks = torch.nn.functional.pixel_unshuffle(pixels.movedim(-1, 1), 8)  # [B, 192, H/8, W/8]
        return torch.einsum("oc,bchw->bohw", self.weight, blocks - 0.5)


def text(name: str, tokens: int) -> list:
    emb = randn(f"fill/cond/{name}", (1, tokens, FLUX["context"]))
    return [[emb, {"pooled_output": randn(f"fill/pooled/{name}", (1, FLUX["vec"]))}]]


def soft_mask(height: int, width: int) -> torch.Tensor:
    """A MASK [1, H, W]: 1 in a window, 0 outside, a linear ramp on its top edge."""
    m = torch.zeros(1, height, width)
    m[:, height // 3 :, width // 4 : width - width // 4] = 1.0
    ramp = torch.linspace(0.0, 1.0, height // 6 + 2)[1:-1]
    m[:, height // 3 - ramp.numel() : height // 3, width // 4 : width - width // 4] = ramp[:, None]
    return m


def fill_file_state(c, dev: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Fill structure (ComfyUI's Flux with in_channels 96), checked to be the dev file but img_in."""
    state = flux_state(c, guidance=True, in_channels=96)
    assert state.keys() == dev.keys() and state["img_in.weight"].shape[1] == FILL_IN
    assert all(torch.equal(state[k], dev[k]) for k in dev if k != "img_in.weight"), "dev file moved"
    assert torch.equal(
        state["img_in.weight"], fill_state({"img_in.weight": (FLUX["hidden"], FILL_IN)})["img_in.weight"]
    )
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        overrides = detection_overrides(c)
        from safetensors.torch import load_file, save_file

        state = fill_file_state(c, load_file(str(HERE / DEV_FILE)))
        path = Path(base_dir) / "comfy_ref_flux_fill.safetensors"
        save_file(state, str(path))
        model = c.comfy.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
        assert type(model.model.model_config).__name__ == "FluxInpaint", type(model.model.model_config)
        vae = StandInVAE()
        pixels = {size: torch.rand(1, *size, 3, generator=torch.Generator().manual_seed(3)) for size in SIZES}
        tensors: dict[str, torch.Tensor] = {}
        pos, neg = text("pos", 5), text("neg", 3)
        base = {"seed": 7, "steps": 3, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}
        cases = [
            {**base, "name": "fill_guidance", "what": "FluxGuidance 30, cfg 1, mask at 40x30 (interpolated)",
             "cfg": 1.0, "guidance": 30.0, "mask": soft_mask(40, 30)},
            {**base, "name": "fill_cfg", "what": "cfg 2 (both conditionings through the node), pixel-size mask, "
             "dpmpp_2m, denoise 0.8", "cfg": 2.0, "guidance": 10.0, "mask": soft_mask(64, 48),
             "sampler_name": "dpmpp_2m", "denoise": 0.8},
            {**base, "name": "fill_odd_size", "what": "72x56 px: a 9x7 latent, padded to whole patches with the "
             "Fill channels", "cfg": 1.0, "guidance": 30.0, "mask": soft_mask(72, 56), "pixels": (72, 56)},
        ]  # fmt: skip
        records = []
        for case in cases:
            name = case["name"]
            (positive,) = c.nodes_flux.FluxGuidance.execute(pos, case["guidance"]).result
            positive, negative, latent = c.nodes.InpaintModelConditioning().encode(
                positive, neg, pixels[case.get("pixels", SIZES[0])], vae, case["mask"], noise_mask=True
            )
            with torch.no_grad():
                (out,) = c.nodes.KSampler().sample(
                    model, case["seed"], case["steps"], case["cfg"], case["sampler_name"], case["scheduler"],
                    positive, negative, latent, denoise=case["denoise"],
                )  # fmt: skip
            for role, cond in (("positive", positive), ("negative", negative)):
                ((embeds, options),) = cond
                tensors[f"{name}.{role}.embeds"] = embeds
                tensors[f"{name}.{role}.pooled"] = options["pooled_output"]
                tensors[f"{name}.{role}.concat_latent_image"] = options["concat_latent_image"]
                tensors[f"{name}.{role}.concat_mask"] = options["concat_mask"]
            tensors[f"{name}.samples"] = latent["samples"]
            tensors[f"{name}.noise_mask"] = latent["noise_mask"]
            tensors[f"{name}.expected"] = out["samples"]
            records.append({k: v for k, v in case.items() if k != "mask"})
            print(f"{name:16s} {tuple(out['samples'].shape)} mean |x| {out['samples'].abs().mean():.4f}")
        img_in = state["img_in.weight"].contiguous().numpy().tobytes()
        reference = {
            "generator": "tests/data/make_comfy_fill_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT},
            "torch": torch.__version__,
            "base_file": DEV_FILE,
            "img_in": {"shape": list(state["img_in.weight"].shape), "sha256": hashlib.sha256(img_in).hexdigest()},
            "detected_as": "FluxInpaint",
            "detection_overrides": overrides.get("flux", {}),
            "cases": records,
        }
    compact = ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(tensor_json(v), separators=(',', ':'))}" for k, v in sorted(tensors.items())
    )
    text_out = json.dumps(reference, indent=1)[:-2] + ',\n "tensors": {\n' + compact + "\n }\n}\n"
    json.loads(text_out)
    out_path = args.out / JSON_NAME
    out_path.write_text(text_out, encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
