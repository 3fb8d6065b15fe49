"""Regenerate tests/data/comfy_hunyuan_video_replace_reference.json: ComfyUI's OWN HunyuanImageToVideo
"v2 (replace)" + KSampler on a tiny 16-channel HunyuanVideo file.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_hunyuan_video_replace_reference.py \
        /work/shared/ComfyUI

What runs is ComfyUI's: the tiny Tencent-layout file of make_comfy_hunyuan_video_reference.py's text-to-video case
(salt "t2v", guidance input: the 16-channel HunyuanVideo-I2V has the same tensors, ComfyUI loads both as
``HunyuanVideo``) through ``comfy.sd.load_diffusion_model``; ``HunyuanImageToVideo`` with guidance_type
"v2 (replace)" (the positive gets ``guiding_frame_index`` 0, the LATENT the start image's latent on its first frame
and a noise mask keeping it); ``FluxGuidance``; ``KSampler``. CONDITIONING tensors are given directly (the Llama
tokenizer file is missing: shared/COMFYUI.md) and the VAE is a stand-in whose ``encode`` returns a fixed latent.
Two runs: the positive alone (cfg 1, embedded guidance 4.5) and true CFG 2.5 over a negative without
``guiding_frame_index`` (ComfyUI runs that branch with one modulation for every token). And "custom": the start
image's latent as ``ref_latent`` on the positive (its tokens join the video's, at frame -1 beside the frame), CFG 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import tensor_json  # noqa: E402
from hunyuan_video_tiny_weights import TinyHunyuanVideo  # noqa: E402
from make_comfy_hunyuan_video_reference import (  # noqa: E402
    HEIGHT,
    LENGTH,
    WIDTH,
    conditioning,
    import_comfy,
    ksampler,
    load_model,
)
from make_comfy_wan_reference import COMFY_COMMIT, StubVAE, dump_json, start_image  # noqa: E402

RUNS = (  # seed, steps, cfg, sampler, scheduler, FluxGuidance
    (5, 3, 1.0, "euler", "simple", 4.5),
    (9, 3, 2.5, "euler_ancestral", "normal", 6.0),
)


def case_replace(c, folder: Path) -> dict:
    cfg = TinyHunyuanVideo()
    model, info = load_model(c, folder, cfg, "t2v")
    pos, pos_recipe = conditioning("replace/positive", 10, cfg.text_dim)
    neg, neg_recipe = conditioning("replace/negative", 6, cfg.text_dim)
    vae = StubVAE("replace/vae", 16, 8)
    image, image_recipe = start_image("replace/image", HEIGHT, WIDTH)
    pos2, latent = c.hunyuan.HunyuanImageToVideo().encode(
        pos, vae, WIDTH, HEIGHT, LENGTH, 1, "v2 (replace)", start_image=image
    )
    assert pos2[0][1]["guiding_frame_index"] == 0
    runs = []
    for seed, steps, scale, sampler, scheduler, guidance in RUNS:
        positive = c.flux.FluxGuidance().append(pos2, guidance)[0]
        out = ksampler(c, model, seed, steps, scale, sampler, scheduler, positive, neg, latent)
        runs.append(
            {"seed": seed, "steps": steps, "cfg": scale, "sampler": sampler, "scheduler": scheduler,
             "guidance": guidance, "output": tensor_json(out["samples"])}
        )  # fmt: skip
    return {
        "model": info,
        "positive": pos_recipe,
        "negative": neg_recipe,
        "start_image": image_recipe,
        "image_to_video": {"width": WIDTH, "height": HEIGHT, "length": LENGTH, "batch_size": 1},
        "guidance_type": "v2 (replace)",
        "guiding_frame_index": 0,
        "vae_encode": vae.calls,
        "latent": tensor_json(latent["samples"]),
        "noise_mask": tensor_json(latent["noise_mask"]),
        "runs": runs,
    }


def case_custom(c, folder: Path) -> dict:
    """HunyuanImageToVideo "custom": the start image's latent as ``ref_latent`` (its tokens join the sequence)."""
    cfg = TinyHunyuanVideo()
    model, info = load_model(c, folder, cfg, "t2v")
    pos, pos_recipe = conditioning("custom/positive", 8, cfg.text_dim)
    neg, neg_recipe = conditioning("custom/negative", 5, cfg.text_dim)
    vae = StubVAE("custom/vae", 16, 8)
    image, image_recipe = start_image("custom/image", HEIGHT, WIDTH)
    pos2, latent = c.hunyuan.HunyuanImageToVideo().encode(
        pos, vae, WIDTH, HEIGHT, LENGTH, 1, "custom", start_image=image
    )
    seed, steps, scale, sampler, scheduler, guidance = 11, 3, 2.0, "euler", "simple", 5.0
    positive = c.flux.FluxGuidance().append(pos2, guidance)[0]
    out = ksampler(c, model, seed, steps, scale, sampler, scheduler, positive, neg, latent)
    return {
        "model": info,
        "positive": pos_recipe,
        "negative": neg_recipe,
        "start_image": image_recipe,
        "guidance_type": "custom",
        "ref_latent": tensor_json(pos2[0][1]["ref_latent"]),
        "latent": tensor_json(latent["samples"]),
        "runs": [
            {"seed": seed, "steps": steps, "cfg": scale, "sampler": sampler, "scheduler": scheduler,
             "guidance": guidance, "output": tensor_json(out["samples"])}
        ],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=COMFY_COMMIT)
    here = Path(__file__).resolve().parent
    parser.add_argument("--out", type=Path, default=here / "comfy_hunyuan_video_replace_reference.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="comfy-hunyuan-replace-ref-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        ref = {
            "source": {
                "comfyui_commit": args.commit,
                "script": "tests/data/make_comfy_hunyuan_video_replace_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/hunyuan_video_tiny_weights.py (hashed_uniform; digests below)",
            },
            "replace": case_replace(c, folder),
            "custom": case_custom(c, folder),
        }
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
