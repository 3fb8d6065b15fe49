"""Regenerate tests/data/comfy_qwen_diffsynth_reference.json with ComfyUI 0.3.64's OWN nodes for a DiffSynth
Qwen-Image ControlNet model patch.

Run by hand (not in CI) with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_qwen_diffsynth_reference.py --comfy /work/shared/ComfyUI

The graph per case: the tiny Qwen-Image (tests/data/tiny_qwen_image_bf16.safetensors, loaded as
make_comfy_qwen_image_reference.py loads it) -> ``ModelPatchLoader`` (tests/data/tiny_qwen_diffsynth_controlnet
.safetensors, tests/controlnet_files.py's tiny patch, copied into a private models/model_patches; the loader builds
the 20B model's 60 blocks x 3072, so the tiny block count and width are put in its constructor's defaults) ->
``QwenImageDiffsynthControlnet`` (VAE, image, strength; chained when a case applies two) -> ``KSampler``. The VAE is
tests/data/controlnet_hint_vae.py's stand-in with a frame axis (Qwen-Image's Wan VAE gives [B, 16, 1, h, w]).
Nothing from this repository's engine is imported.
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
from make_comfy_qwen_image_reference import FILES, comfy_commit  # noqa: E402

MODEL_FILE = FILES["bf16"]
PATCH_FILE = "tiny_qwen_diffsynth_controlnet.safetensors"
JSON_NAME = "comfy_qwen_diffsynth_reference.json"
BLOCKS, WIDTH = 3, 32  # the tiny patch's blocks and width (the loader's defaults are the 20B model's 60 x 3072)
# name, what, positive, negative, latent [B, 16, h, w], cfg, steps, [(hint, strength)]
CASES = (
    ("canny_cfg", "0.8, cfg 2.5, texts of 7 and 5 tokens (branches run apart)", "pos7", "neg5", [1, 16, 8, 12], 2.5, 4,
     [("edges", 0.8)]),
    ("depth_batched", "1.0, cfg 2, both texts 6 tokens (one batch)", "pos6", "neg6", [1, 16, 8, 12], 2.0, 4,
     [("depth", 1.0)]),
    ("chained", "depth 0.7 then edges -0.5 (two patches, applied in order), cfg 1.5", "pos7", "neg5", [1, 16, 8, 12],
     1.5, 4, [("depth", 0.7), ("edges", -0.5)]),
    ("odd_grid_cfg1", "1.2 on a 5x3-token grid, cfg 1", "pos7", "neg5", [1, 16, 10, 6], 1.0, 3, [("edges", 1.2)]),
)  # fmt: skip


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
        images = {name: hint_image(*spec) for name, spec in HINTS.items()}
        for name, image in images.items():
            tensors[f"hint.{name}"] = image
        for name, what, pos, neg, latent_shape, cfg, steps, applies in CASES:
            positive, negative = [[tensors[f"text.{pos}"], {}]], [[tensors[f"text.{neg}"], {}]]
            vae = HintVAE(frame_axis=True)
            patched = model
            latent = {"samples": torch.zeros(latent_shape)}
            with torch.inference_mode():  # ComfyUI runs every node so
                for hint, strength in applies:
                    (patched,) = model_patch.QwenImageDiffsynthControlnet().diffsynth_controlnet(
                        patched, patch, vae, images[hint], strength
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
                    "applies": [dict(zip(("hint", "strength"), a)) for a in applies],
                }
            )
            print(f"{name:16s} ok {tuple(out['samples'].shape)} vae calls {vae.calls}")
    reference = {
        "generator": "tests/data/make_comfy_qwen_diffsynth_reference.py",
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
