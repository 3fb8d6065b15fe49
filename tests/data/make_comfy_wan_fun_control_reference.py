"""Regenerate tests/data/comfy_wan_fun_control_reference.json: ComfyUI 0.3.64's OWN WanFunControlToVideo /
Wan22FunControlToVideo + KSampler on tiny Wan Fun-Control-structure files (UNETLoader's loading path).

Run by hand (not in CI) with a Python that imports ComfyUI (torch + ComfyUI's requirements), e.g.

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-07b788fab6/bin/python \
        tests/data/make_comfy_wan_fun_control_reference.py /work/shared/ComfyUI

The files are ``wan_tiny_weights``' tiny Wan (2 blocks, width 256) in the original layout with a wider
``patch_embedding``: 48 input channels with the CLIP-vision image embedding (ComfyUI detects
``WAN21_FunControl2V``: latent, control video, start image) and 52 without it (Wan 2.2 Fun-Control: latent,
control video, 4 mask channels, start image; ComfyUI's ``WAN21_T2V`` class with ``concat_mask_index``), that one
also with a reference-image ``ref_conv`` as Fun-Control v1.1 / Wan 2.2 Fun files carry (unused without a
``ref_image``; ``fun22_ref_image`` gives one). They are
written to a temporary folder and loaded with ``comfy.sd.load_diffusion_model``; the test rebuilds them and
checks their digests. The VAE the nodes call is ``make_comfy_wan_reference.StubVAE`` (a fixed latent per name
and frame count): the nodes' own resizing, zero-filling, channel placement and mask run for real, and the test
feeds our engine the CONDITIONING and LATENT they made, as stored here. Wan22FunControlToVideo's graph has no
start-image input in 0.3.64's schema; its ``execute`` takes one, and it is given one here so that the mask
channels between control and start image are not all zero. Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import tensor_json  # noqa: E402
from make_comfy_wan_reference import (  # noqa: E402
    COMFY_COMMIT,
    HEIGHT,
    LENGTH,
    WIDTH,
    ClipVisionOutput,
    StubVAE,
    conditioning,
    dump_json,
    generated,
    import_comfy,
    ksampler,
    load_model,
    start_image,
)
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest  # noqa: E402

OUT = Path(__file__).resolve().parent / "comfy_wan_fun_control_reference.json"


class StubVAE22(StubVAE):
    """The stand-in with what Wan22FunControlToVideo also asks of a VAE."""

    latent_channels = 16

    def spacial_compression_encode(self) -> int:
        return self.spatial


def control_video(name: str, frames: int, h: int, w: int) -> tuple[torch.Tensor, dict]:
    """An IMAGE batch of ``frames`` frames in 0..1 and its recipe."""
    video = hashed_uniform(name, (frames, h, w, 3), 0.5, 0.5)
    recipe = {"name": name, "shape": [frames, h, w, 3], "scale": 0.5, "offset": 0.5}
    return video, {**recipe, "digest": state_digest({"t": video})}


def run_case(c, model, info: dict, name: str, node: str, pos, neg, recipes: dict, extras: tuple, **settings) -> dict:
    pos2, neg2, latent = extras
    out = ksampler(
        c, model, settings["seed"], settings["steps"], settings["cfg"], "euler", "simple", pos2, neg2, latent
    )
    options = pos2[0][1]
    assert all(torch.equal(v, neg2[0][1][k]) for k, v in options.items() if isinstance(v, torch.Tensor))
    record = {
        "model": info,
        "node": node,
        **recipes,
        "latent": tensor_json(latent["samples"]),
        "seed": settings["seed"],
        "steps": settings["steps"],
        "cfg": settings["cfg"],
        "sampler": "euler",
        "scheduler": "simple",
        "output": tensor_json(out["samples"]),
    }
    for key in ("concat_latent_image", "concat_mask"):
        record[key] = tensor_json(options[key]) if key in options else None
    record["concat_mask_index"] = options.get("concat_mask_index", 0)
    refs = options.get("reference_latents")
    record["reference_latents"] = None if refs is None else [tensor_json(t) for t in refs]
    print(
        f"{name:16s} {info['comfy_model_class']:8s} {tuple(out['samples'].shape)} |x| {out['samples'].abs().mean():.4f}"
    )
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="comfy-wan-fun-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        ref: dict = {
            "source": {
                "comfyui_commit": COMFY_COMMIT,
                "script": "tests/data/make_comfy_wan_fun_control_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/wan_tiny_weights.py (hashed_uniform; digests below)",
            }
        }
        # Wan 2.1 Fun-Control: 48 channels, CLIP-vision image K/V (ComfyUI: WAN21_FunControl2V)
        model, info = load_model(c, folder, TinyWan(in_dim=48, clip_vision=True), "fun21")
        info["comfy_model_config"] = type(model.model.model_config).__name__
        assert info["comfy_model_config"] == "WAN21_FunControl2V", info["comfy_model_config"]
        name = "fun21"
        pos, pos_recipe = conditioning(f"{name}/positive", 512)
        neg, neg_recipe = conditioning(f"{name}/negative", 512)
        states, clip_recipe = generated(f"{name}/clip_vision", (1, 257, 1280), 1.0)
        image, image_recipe = start_image(f"{name}/image", HEIGHT, WIDTH)
        video, video_recipe = control_video(f"{name}/control", LENGTH, HEIGHT, WIDTH)
        common = {"positive": pos_recipe, "negative": neg_recipe, "clip_vision": clip_recipe}
        vae = StubVAE(f"{name}/vae", 16, 8)
        made = c.wan.WanFunControlToVideo.execute(
            pos, neg, vae, WIDTH, HEIGHT, LENGTH, 1, start_image=image,
            clip_vision_output=ClipVisionOutput(states), control_video=video,
        ).args  # fmt: skip
        recipes = {**common, "start_image": image_recipe, "control_video": video_recipe, "vae_encode": vae.calls}
        ref["fun21"] = run_case(c, model, info, name, "WanFunControlToVideo", pos, neg, recipes, made,
                                seed=5, steps=3, cfg=3.0)  # fmt: skip
        vae = StubVAE(f"{name}/vae", 16, 8)
        made = c.wan.WanFunControlToVideo.execute(
            pos, neg, vae, WIDTH, HEIGHT, LENGTH, 1, clip_vision_output=ClipVisionOutput(states), control_video=video
        ).args
        recipes = {**common, "start_image": None, "control_video": video_recipe, "vae_encode": vae.calls}
        ref["fun21_control_only"] = run_case(c, model, info, name, "WanFunControlToVideo", pos, neg, recipes, made,
                                             seed=8, steps=2, cfg=1.0)  # fmt: skip
        (latent,) = c.hunyuan.EmptyHunyuanLatentVideo().generate(WIDTH, HEIGHT, LENGTH, 1)
        clip_pos = [[pos[0][0], {"clip_vision_output": ClipVisionOutput(states)}]]
        clip_neg = [[neg[0][0], {"clip_vision_output": ClipVisionOutput(states)}]]
        ref["fun21_no_control"] = run_case(c, model, info, name, "EmptyHunyuanLatentVideo (no conditioning node)",
                                           pos, neg, common, (clip_pos, clip_neg, latent), seed=4, steps=2, cfg=2.0)  # fmt: skip
        # Wan 2.2 Fun-Control: 52 channels (control, mask, start image), no CLIP vision (ComfyUI: WAN21_T2V)
        model, info = load_model(c, folder, TinyWan(in_dim=52), "fun22")
        info["comfy_model_config"] = type(model.model.model_config).__name__
        assert info["comfy_model_config"] == "WAN21_T2V", info["comfy_model_config"]
        name = "fun22"
        pos, pos_recipe = conditioning(f"{name}/positive", 24)
        neg, neg_recipe = conditioning(f"{name}/negative", 24)
        image, image_recipe = start_image(f"{name}/image", HEIGHT, WIDTH)
        video, video_recipe = control_video(f"{name}/control", LENGTH, HEIGHT, WIDTH)
        vae = StubVAE22(f"{name}/vae", 16, 8)
        made = c.wan.Wan22FunControlToVideo.execute(
            pos, neg, vae, WIDTH, HEIGHT, LENGTH, 1, start_image=image, control_video=video
        ).args
        recipes = {"positive": pos_recipe, "negative": neg_recipe, "clip_vision": None, "start_image": image_recipe,
                   "control_video": video_recipe, "vae_encode": vae.calls}  # fmt: skip
        ref["fun22"] = run_case(c, model, info, name, "Wan22FunControlToVideo", pos, neg, recipes, made,
                                seed=6, steps=3, cfg=2.5)  # fmt: skip
        # the same file with a Fun-Control reference-image conv (v1.1 / Wan 2.2 Fun files carry one): unused
        # without Wan22FunControlToVideo's ref_image
        model, info = load_model(c, folder, TinyWan(in_dim=52, ref_conv=16), "fun22")
        info["comfy_model_config"] = type(model.model.model_config).__name__
        assert model.model.diffusion_model.ref_conv is not None
        ref["fun22_ref_conv_file"] = run_case(c, model, info, name, "Wan22FunControlToVideo", pos, neg, recipes, made,
                                              seed=6, steps=3, cfg=2.5)  # fmt: skip
        # ... and with a ref_image (no start image, so that the reference is the only one-frame encode): the
        # node resizes it to the video and appends its latent to both branches' reference_latents
        ref_image, ref_recipe = start_image(f"{name}/ref_image", HEIGHT + 16, WIDTH - 16)
        vae = StubVAE22(f"{name}/vae_ref", 16, 8)
        made = c.wan.Wan22FunControlToVideo.execute(
            pos, neg, vae, WIDTH, HEIGHT, LENGTH, 1, ref_image=ref_image, control_video=video
        ).args
        assert len(made[0][0][1]["reference_latents"]) == 1
        recipes = {"positive": pos_recipe, "negative": neg_recipe, "clip_vision": None, "start_image": None,
                   "ref_image": ref_recipe, "control_video": video_recipe, "vae_encode": vae.calls}  # fmt: skip
        ref["fun22_ref_image"] = run_case(c, model, info, name, "Wan22FunControlToVideo", pos, neg, recipes, made,
                                          seed=7, steps=3, cfg=2.5)  # fmt: skip
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
