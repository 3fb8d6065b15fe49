"""Regenerate tests/data/comfy_ltx_video_i2v_reference.json: ComfyUI's OWN LTXVImgToVideo + KSampler (image-to-video)
on the tiny LTX-Video file of make_comfy_ltx_video_reference.py.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_ltx_video_i2v_reference.py \
        /work/shared/ComfyUI

``LTXVImgToVideo`` puts the encoded start image in the first latent frame and gives the LATENT a noise mask of
``1 - strength`` there (1 elsewhere); KSampler then samples with ComfyUI's LTXV noise-mask rules (a timestep per
token, the masked frame kept clean). The node's VAE is a stand-in whose ``encode`` returns a generated latent
(the sampler never sees the VAE: it gets the node's LATENT and CONDITIONING); everything else is ComfyUI's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import tensor_json  # noqa: E402
from ltx_video_tiny_weights import TinyLTXVideo  # noqa: E402
from make_comfy_ltx_video_reference import HEIGHT, LENGTH, WIDTH, conditioning, import_comfy, load_model, node  # noqa: E402
from make_comfy_wan_reference import COMFY_COMMIT, dump_json, generated  # noqa: E402

RUNS = (  # (seed, steps, cfg, sampler, scheduler, strength)
    (42, 4, 3.0, "euler", "simple", 1.0),
    (7, 3, 2.5, "euler_ancestral", "normal", 0.6),
)


class EncodedImage:
    """The node's VAE: ``encode`` gives one generated latent frame for the (resized) start image."""

    def __init__(self):
        self.latent, self.recipe = generated("ltx-i2v/image-latent", (1, 128, 1, HEIGHT // 32, WIDTH // 32), 1.0)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        assert tuple(pixels.shape[1:3]) == (HEIGHT, WIDTH)
        return self.latent.repeat(pixels.shape[0], 1, 1, 1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=COMFY_COMMIT)
    here = Path(__file__).resolve().parent
    parser.add_argument("--out", type=Path, default=here / "comfy_ltx_video_i2v_reference.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="comfy-ltx-i2v-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        cfg = TinyLTXVideo()
        model, info = load_model(c, folder, cfg, "t2v")
        vae = EncodedImage()
        image = torch.full((1, HEIGHT, WIDTH, 3), 0.5)
        pos, pos_recipe = conditioning("ltx/positive", 12, 9, cfg.text_dim)
        neg, neg_recipe = conditioning("ltx/negative", 12, 12, cfg.text_dim)
        pos, neg = node(c.lt.LTXVConditioning, pos, neg, 24.0)
        runs = []
        for seed, steps, scale, sampler, scheduler, strength in RUNS:
            positive, negative, latent = node(
                c.lt.LTXVImgToVideo, pos, neg, image, vae, WIDTH, HEIGHT, LENGTH, 1, strength
            )
            assert set(positive[0][1]) == {"attention_mask", "frame_rate"}, "LTXVImgToVideo changed the conditioning"
            (out,) = c.nodes.KSampler().sample(
                model, seed, steps, scale, sampler, scheduler, positive, negative, latent
            )
            runs.append(
                {"seed": seed, "steps": steps, "cfg": scale, "sampler": sampler, "scheduler": scheduler,
                 "strength": strength, "latent": tensor_json(latent["samples"]),
                 "noise_mask": tensor_json(latent["noise_mask"]), "output": tensor_json(out["samples"])}
            )  # fmt: skip
        ref = {
            "source": {
                "comfyui_commit": args.commit,
                "script": "tests/data/make_comfy_ltx_video_i2v_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/ltx_video_tiny_weights.py (hashed_uniform; digest below)",
            },
            "model": info,
            "image_latent": vae.recipe,
            "size": {"width": WIDTH, "height": HEIGHT, "length": LENGTH, "frame_rate": 24.0},
            "positive": pos_recipe,
            "negative": neg_recipe,
            "runs": runs,
        }
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
