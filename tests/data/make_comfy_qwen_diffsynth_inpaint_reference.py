"""Regenerate tests/data/comfy_qwen_diffsynth_inpaint_reference.json with ComfyUI 0.3.64's OWN nodes for a DiffSynth
Qwen-Image inpainting model patch (the patch whose ``img_in`` reads the latent and a mask channel).

Run by hand (not in CI) with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_qwen_diffsynth_inpaint_reference.py --comfy /work/shared/ComfyUI

The graph per case, as make_comfy_qwen_diffsynth_reference.py's: the tiny Qwen-Image -> ``ModelPatchLoader``
(tests/data/tiny_qwen_diffsynth_inpaint.safetensors, tests/controlnet_files.py's tiny inpainting patch, tiny block
count and width in the constructor's defaults) -> ``QwenImageDiffsynthControlnet`` (VAE, image, strength and the
optional MASK) -> ``KSampler``. The masks have other sizes and aspects than the image and the latent. Nothing from
this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from controlnet_hint_vae import HintVAE, hint_image  # noqa: E402
from make_comfy_qwen_controlnet_reference import HINTS, TEXT, tiny_detection  # noqa: E402
from make_comfy_qwen_diffsynth_reference import BLOCKS, WIDTH  # noqa: E402
from make_comfy_qwen_image_reference import FILES, comfy_commit  # noqa: E402

MODEL_FILE = FILES["bf16"]
PATCH_FILE = "tiny_qwen_diffsynth_inpaint.safetensors"
JSON_NAME = "comfy_qwen_diffsynth_inpaint_reference.json"
MASKS = {"box": (40, 56), "soft": (30, 18)}  # name -> (height, width) of a MASK [1, H, W]
# name, what, positive, negative, latent [B, 16, h, w], cfg, steps, hint, strength, mask (None: no mask)
CASES = (
    ("box_cfg", "a box mask (40x56) stretched to an 8x12 latent, 0.9, cfg 2.5, texts of 7 and 5 tokens", "pos7",
     "neg5", [1, 16, 8, 12], 2.5, 4, "edges", 0.9, "box"),
    ("no_mask_batched", "no mask (the patch keeps everything), 1.0, cfg 2, both texts 6 tokens", "pos6", "neg6",
     [1, 16, 8, 12], 2.0, 4, "depth", 1.0, None),
    ("soft_odd_grid_cfg1", "a soft mask (30x18) on a 5x3-token grid, 1.2, cfg 1", "pos7", "neg5", [1, 16, 10, 6],
     1.0, 3, "edges", 1.2, "soft"),
)  # fmt: skip


def make_mask(name: str) -> torch.Tensor:
    """A deterministic MASK [1, H, W] in 0..1: a hard off-centre box, or a soft diagonal ramp with noise."""
    height, width = MASKS[name]
    if name == "box":
        mask = torch.zeros(1, height, width)
        mask[:, 6:30, 10:38] = 1.0
        return mask
    g = torch.Generator().manual_seed(5)
    rows = torch.linspace(0, 1, height)[:, None]
    cols = torch.linspace(0, 1, width)[None, :]
    return (0.7 * rows + 0.5 * cols - 0.2 + 0.1 * torch.rand(height, width, generator=g)).clamp(0, 1).unsqueeze(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    comfy_dir = args.comfy.resolve()
    torch.set_num_threads(1)
    tensors: dict[str, torch.Tensor] = {}
    records = []
    gen = torch.Generator().manual_seed(2026)
    for name, tokens in TEXT.items():
        tensors[f"text.{name}"] = torch.randn(1, tokens, 24, generator=gen)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base:
        (Path(base) / "models" / "model_patches").mkdir(parents=True)
        shutil.copy(HERE / PATCH_FILE, Path(base) / "models" / "model_patches" / PATCH_FILE)
        prepare_comfy(comfy_dir, Path(base))
        import comfy.model_detection
        import comfy.sd
        import comfy.utils
        import comfy_extras.nodes_model_patch as model_patch

        import nodes

        comfy.utils.PROGRESS_BAR_ENABLED = False
        with tiny_detection(comfy.model_detection):
            model = comfy.sd.load_diffusion_model(str(HERE / MODEL_FILE))
        tiny = functools.partial(model_patch.QwenImageBlockWiseControlNet, num_layers=BLOCKS, dim=WIDTH)
        with mock.patch.object(model_patch, "QwenImageBlockWiseControlNet", tiny):  # ComfyUI builds 60 x 3072
            (patch,) = model_patch.ModelPatchLoader().load_model_patch(PATCH_FILE)
        assert patch.model.additional_in_dim == 4, patch.model.additional_in_dim  # ComfyUI reads it as inpainting
        images = {name: hint_image(*spec) for name, spec in HINTS.items()}
        masks = {name: make_mask(name) for name in MASKS}
        tensors.update({f"hint.{k}": v for k, v in images.items()} | {f"mask.{k}": v for k, v in masks.items()})
        for name, what, pos, neg, latent_shape, cfg, steps, hint, strength, mask in CASES:
            positive, negative = [[tensors[f"text.{pos}"], {}]], [[tensors[f"text.{neg}"], {}]]
            vae = HintVAE(frame_axis=True)
            latent = {"samples": torch.zeros(latent_shape)}
            with torch.inference_mode():  # ComfyUI runs every node so
                (patched,) = model_patch.QwenImageDiffsynthControlnet().diffsynth_controlnet(
                    model, patch, vae, images[hint], strength, mask=None if mask is None else masks[mask]
                )
                (out,) = nodes.KSampler().sample(
                    patched, 7, steps, cfg, "euler", "simple", positive, negative, latent, denoise=1.0
                )
            tensors[f"{name}.expected"] = out["samples"]
            records.append(
                {
                    "name": name,
                    "what": what,
                    "positive": pos,
                    "negative": neg,
                    "latent_shape": latent_shape,
                    "cfg": cfg,
                    "steps": steps,
                    "seed": 7,
                    "sampler_name": "euler",
                    "scheduler": "simple",
                    "hint": hint,
                    "strength": strength,
                    "mask": mask,
                }
            )
            print(f"{name:20s} ok {tuple(out['samples'].shape)} vae calls {vae.calls}")
    reference = {
        "generator": "tests/data/make_comfy_qwen_diffsynth_inpaint_reference.py",
        "comfyui_commit": comfy_commit(comfy_dir),
        "torch": torch.__version__,
        "model_file": MODEL_FILE,
        "model_sha256": hashlib.sha256((HERE / MODEL_FILE).read_bytes()).hexdigest(),
        "patch_file": PATCH_FILE,
        "patch_sha256": hashlib.sha256((HERE / PATCH_FILE).read_bytes()).hexdigest(),
        "cases": records,
        "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
    }
    out_path = HERE / JSON_NAME
    out_path.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
