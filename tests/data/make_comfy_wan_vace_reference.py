"""Regenerate tests/data/comfy_wan_vace_reference.json: ComfyUI 0.3.64's OWN WanVaceToVideo + KSampler on a tiny
Wan VACE file (UNETLoader's loading path).

Run by hand (not in CI) with a Python that imports ComfyUI (torch + ComfyUI's requirements), e.g.

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-07b788fab6/bin/python \\
        tests/data/make_comfy_wan_vace_reference.py /work/shared/ComfyUI

The file is ``wan_tiny_weights``' tiny Wan (4 blocks, width 256) in the original layout with 2 VACE hint blocks
(``vace_blocks.N``, ``vace_patch_embedding``): ComfyUI detects ``WAN21_Vace`` and runs its hints after main blocks
0 and 2. It is written to a temporary folder and loaded with ``comfy.sd.load_diffusion_model``; the test rebuilds
it and checks its digest. The VAE the node calls is ``PixelStubVAE`` (a fixed latent per name and frame count,
scaled by the pixels' mean, so that the inactive and reactive halves differ): the node's own resizing, masking,
mask packing, reference frame and strength run for real, and the test feeds our engine the CONDITIONING and
LATENT they made, as stored here. Cases: one control video with a mask, two chained WanVaceToVideo entries of
different strengths, a reference image (an extra leading latent frame; trim_latent 1), and the VACE model without
any entry (ComfyUI's default entry). Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import tensor_json  # noqa: E402
from make_comfy_wan_reference import COMFY_COMMIT, StubVAE, conditioning, dump_json, import_comfy, ksampler, load_model  # noqa: E402
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest  # noqa: E402

OUT = Path(__file__).resolve().parent / "comfy_wan_vace_reference.json"
WIDTH, HEIGHT, LENGTH = 32, 32, 5  # 2 latent frames of 4x4: 8 video tokens
MODEL = TinyWan(num_layers=4, vace_blocks=2)


class PixelStubVAE(StubVAE):
    """StubVAE whose latent also follows the pixels (their mean), so that different pixels encode differently."""

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return super().encode(pixels) * (0.5 + pixels.float().mean())


def pixels(name: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, dict]:
    """Values in 0..1 and their recipe (``hashed_uniform(name, shape, 0.5, 0.5)``)."""
    t = hashed_uniform(name, shape, 0.5, 0.5)
    return t, {"name": name, "shape": list(shape), "scale": 0.5, "offset": 0.5, "digest": state_digest({"t": t})}


def vace(c, pos, neg, vae, strength, video=None, mask=None, reference=None):
    made = c.wan.WanVaceToVideo.execute(
        pos, neg, vae, WIDTH, HEIGHT, LENGTH, 1, strength, control_video=video, control_masks=mask,
        reference_image=reference,
    ).args  # fmt: skip
    return made  # (positive, negative, latent, trim_latent)


def record(c, model, info, name, pos, neg, latent, trim, recipes, seed, steps, cfg) -> dict:
    out = ksampler(c, model, seed, steps, cfg, "euler", "simple", pos, neg, latent)
    options = pos[0][1]
    for key in ("vace_frames", "vace_mask"):  # the node gives both branches the same entries
        assert all(torch.equal(a, b) for a, b in zip(options.get(key, []), neg[0][1].get(key, []), strict=True))
    print(
        f"{name:12s} {info['comfy_model_class']:10s} {tuple(out['samples'].shape)} |x| {out['samples'].abs().mean():.4f}"
    )
    return {
        "model": info,
        **recipes,
        "vace_frames": [tensor_json(t) for t in options.get("vace_frames", [])],
        "vace_mask": [tensor_json(t) for t in options.get("vace_mask", [])],
        "vace_strength": list(options.get("vace_strength", [])),
        "trim_latent": trim,
        "latent": tensor_json(latent["samples"]),
        "seed": seed,
        "steps": steps,
        "cfg": cfg,
        "sampler": "euler",
        "scheduler": "simple",
        "output": tensor_json(out["samples"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="comfy-wan-vace-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        model, info = load_model(c, folder, MODEL, "vace")
        info["comfy_model_config"] = type(model.model.model_config).__name__
        assert info["comfy_model_class"] == "WAN21_Vace", info["comfy_model_class"]
        assert model.model.diffusion_model.vace_layers_mapping == {0: 0, 2: 1}
        ref: dict = {
            "source": {
                "comfyui_commit": COMFY_COMMIT,
                "script": "tests/data/make_comfy_wan_vace_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/wan_tiny_weights.py (hashed_uniform; digests below)",
            }
        }
        pos, pos_recipe = conditioning("vace/positive", 24)
        neg, neg_recipe = conditioning("vace/negative", 24)
        video, video_recipe = pixels("vace/control", (LENGTH, HEIGHT, WIDTH, 3))
        mask, mask_recipe = pixels("vace/mask", (LENGTH, HEIGHT, WIDTH))
        mask = (mask > 0.5).float()  # which pixels the control video drives
        video2, video2_recipe = pixels("vace/control2", (LENGTH, HEIGHT, WIDTH, 3))
        image, image_recipe = pixels("vace/reference", (1, HEIGHT, WIDTH, 3))
        common = {"positive": pos_recipe, "negative": neg_recipe}

        vae = PixelStubVAE("vace/vae", 16, 8)
        p, n, latent, trim = vace(c, pos, neg, vae, 0.8, video, mask)
        recipes = {**common, "control_video": video_recipe, "control_mask": mask_recipe, "vae_encode": vae.calls}
        ref["vace"] = record(c, model, info, "vace", p, n, latent, trim, recipes, seed=5, steps=3, cfg=3.0)

        vae = PixelStubVAE("vace/vae", 16, 8)
        p, n, latent, trim = vace(c, pos, neg, vae, 1.0, video, mask)
        p, n, latent, trim = vace(c, p, n, vae, 0.5, video2)
        recipes = {**common, "control_video": [video_recipe, video2_recipe], "vae_encode": vae.calls}
        ref["vace_two"] = record(c, model, info, "vace_two", p, n, latent, trim, recipes, seed=7, steps=2, cfg=2.0)

        vae = PixelStubVAE("vace/vae", 16, 8)
        p, n, latent, trim = vace(c, pos, neg, vae, 1.0, video, reference=image)
        assert trim == 1 and latent["samples"].shape[2] == 3
        recipes = {**common, "control_video": video_recipe, "reference_image": image_recipe, "vae_encode": vae.calls}
        ref["vace_reference"] = record(c, model, info, "vace_reference", p, n, latent, trim, recipes,
                                       seed=9, steps=2, cfg=2.5)  # fmt: skip

        (latent,) = c.hunyuan.EmptyHunyuanLatentVideo().generate(WIDTH, HEIGHT, LENGTH, 1)
        ref["vace_none"] = record(c, model, info, "vace_none", pos, neg, latent, 0, common, seed=4, steps=2, cfg=2.0)
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
