"""Regenerate tests/data/comfy_preview_image_reference.json: ComfyUI's OWN live-preview pictures.

Run by hand (not in CI) with a Python that imports ComfyUI (see comfy_setup.py), e.g. the venv the tests under
tests/comfyui build for it:

    python tests/data/make_comfy_preview_image_reference.py /path/to/ComfyUI --commit <ComfyUI git commit>

For every latent format ComfyUI gives the models this project runs (Flux, SD3, SD15 and SDXL for PixArt,
Wan21 for Wan 2.1 and Qwen-Image, Wan22), it builds a small model-space x0 from a fixed formula (a video format:
two frames) and stores it with the picture ComfyUI's ``latent_preview.Latent2RGBPreviewer`` makes of it (the
previewer KSampler uses under ``--preview-method auto`` / ``latent2rgb``): uint8 RGB [height, width, 3].
``tests/test_previews.py`` checks that the previews the workers make equal these. Nothing from parallel_runtime
is imported.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FORMATS = ("Flux", "SD3", "SD15", "SDXL", "Wan21", "Wan22")
HEIGHT, WIDTH, FRAMES = 3, 5, 2


def x0_of(channels: int, video: bool):
    """A fixed model-space latent [1, C, H, W] (video: [1, C, FRAMES, H, W]) of values around -2..2."""
    import torch

    c = torch.arange(channels, dtype=torch.float32).view(-1, 1, 1, 1)
    t = torch.arange(FRAMES if video else 1, dtype=torch.float32).view(1, -1, 1, 1)
    h = torch.arange(HEIGHT, dtype=torch.float32).view(1, 1, -1, 1)
    w = torch.arange(WIDTH, dtype=torch.float32).view(1, 1, 1, -1)
    x = 2.0 * torch.sin(1.3 * c + 0.7 * h + 0.4 * w + 1.1 * t) * torch.cos(0.3 * c - 0.2 * w)
    return x.unsqueeze(0) if video else x[:, 0].unsqueeze(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=None, help="ComfyUI commit (read with git when not given)")
    parser.add_argument("--out", type=Path, default=HERE / "comfy_preview_image_reference.json")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from comfy_setup import prepare_comfy, tensor_json

    prepare_comfy(args.comfy_dir)
    import comfy.latent_formats as lf
    import latent_preview
    import numpy as np

    cases = {}
    for name in FORMATS:
        fmt = getattr(lf, name)()
        video = fmt.latent_dimensions == 3
        x0 = x0_of(fmt.latent_channels, video)
        previewer = latent_preview.Latent2RGBPreviewer(fmt.latent_rgb_factors, fmt.latent_rgb_factors_bias)
        picture = np.asarray(previewer.decode_latent_to_preview(x0.clone()))
        cases[name] = {"x0": tensor_json(x0), "image": picture.astype(int).tolist()}
    commit = args.commit
    if commit is None:
        proc = subprocess.run(["git", "-C", str(args.comfy_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = proc.stdout.strip() or "unknown"
    out = {"comfyui_commit": commit, "previewer": "Latent2RGBPreviewer", "cases": cases}
    args.out.write_text(json.dumps(out) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {', '.join(cases)}")


if __name__ == "__main__":
    main()
