"""Regenerate tests/data/comfy_hunyuan_video_reference.json by running ComfyUI's OWN HunyuanVideo code on tiny files.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_hunyuan_video_reference.py /work/shared/ComfyUI

What runs is ComfyUI's: the transformer files (Tencent's key layout, weights from ``hunyuan_video_tiny_weights``)
are written to a temporary folder and loaded with ``comfy.sd.load_diffusion_model`` (UNETLoader's path: model
detection, the HunyuanVideo / HunyuanVideoI2V model classes, fp32 on the CPU); latents come from
``EmptyHunyuanLatentVideo`` and ``HunyuanImageToVideo`` ("v1 (concat)"); guidance from ``FluxGuidance``;
sampling is ``KSampler`` (``nodes.common_ksampler``). ComfyUI's Llama tokenizer file is missing from the snapshot
(shared/COMFYUI.md), so the CONDITIONING tensors are given directly: generated Llama states (the tiny width) and a
768-wide CLIP-L pooled output. ``HunyuanImageToVideo``'s VAE is a stand-in whose ``encode`` returns a fixed latent.
The VAE case decodes a generated latent with ComfyUI's own 3-D VAE module at a tiny width, as ``VAEDecode`` does.
Big inputs are stored as their recipe plus a digest; small ones and every output as numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from hunyuan_video_tiny_weights import (  # noqa: E402
    VAE_CONFIG,
    TinyHunyuanVideo,
    tiny_hunyuan_video_state_dict,
    vae_weight,
)
from make_comfy_wan_reference import COMFY_COMMIT, StubVAE, dump_json, generated, start_image  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

WIDTH, HEIGHT, LENGTH = 64, 48, 9  # 9 frames -> 3 latent frames of 6x8 (8x spatial, 4x temporal)


def import_comfy(comfy_dir: Path, base: Path) -> SimpleNamespace:
    prepare_comfy(comfy_dir, base, stub_missing=False)
    import comfy.ldm.models.autoencoder as autoencoder
    import comfy.sd
    import comfy_extras.nodes_flux as flux
    import comfy_extras.nodes_hunyuan as hunyuan

    import nodes

    return SimpleNamespace(sd=comfy.sd, nodes=nodes, hunyuan=hunyuan, flux=flux, autoencoder=autoencoder)


def load_model(c: SimpleNamespace, folder: Path, cfg: TinyHunyuanVideo, salt: str) -> tuple[object, dict]:
    from safetensors.torch import save_file

    sd = tiny_hunyuan_video_state_dict(cfg, salt)
    path = folder / f"tiny_hunyuan_video_{salt}.safetensors"
    save_file(sd, str(path))
    model = c.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
    base = model.model
    info = {
        "config": dataclasses.asdict(cfg),
        "salt": salt,
        "digest": state_digest(sd),
        "comfy_model_class": type(base).__name__,
        "comfy_latent_format": type(base.latent_format).__name__,
        "comfy_scale_factor": float(base.latent_format.scale_factor),
        "comfy_shift": float(base.model_sampling.shift),
        "comfy_multiplier": float(base.model_sampling.multiplier),
    }
    return model, info


def conditioning(name: str, tokens: int, text_dim: int, **options) -> tuple[list, dict]:
    """A CONDITIONING with generated Llama states [1, tokens, text_dim] and CLIP-L pooled output [1, 768]."""
    emb, recipe = generated(f"{name}/llama", (1, tokens, text_dim), 1.0)
    pooled, pooled_recipe = generated(f"{name}/pooled", (1, 768), 1.0)
    return [[emb, {"pooled_output": pooled, **options}]], {"llama": recipe, "pooled": pooled_recipe, **options}


def ksampler(c, model, seed, steps, cfg, sampler, scheduler, pos, neg, latent) -> torch.Tensor:
    (out,) = c.nodes.KSampler().sample(model, seed, steps, cfg, sampler, scheduler, pos, neg, latent)
    return out


def case_t2v(c, folder: Path) -> dict:
    cfg = TinyHunyuanVideo()
    model, info = load_model(c, folder, cfg, "t2v")
    (latent,) = c.hunyuan.EmptyHunyuanLatentVideo().generate(WIDTH, HEIGHT, LENGTH, 1)
    pos, pos_recipe = conditioning("t2v/positive", 11, cfg.text_dim)
    neg, neg_recipe = conditioning("t2v/negative", 7, cfg.text_dim)
    runs = []
    for seed, steps, scale, sampler, scheduler, guidance in (
        (42, 4, 1.0, "euler", "simple", None),  # ComfyUI's default embedded guidance (6.0)
        (7, 3, 3.0, "euler_ancestral", "normal", 3.5),  # true CFG over a FluxGuidance'd positive
    ):
        positive = pos if guidance is None else c.flux.FluxGuidance().append(pos, guidance)[0]
        out = ksampler(c, model, seed, steps, scale, sampler, scheduler, positive, neg, latent)
        runs.append(
            {"seed": seed, "steps": steps, "cfg": scale, "sampler": sampler, "scheduler": scheduler,
             "guidance": guidance, "output": tensor_json(out["samples"])}
        )  # fmt: skip
    return {
        "model": info,
        "latent": tensor_json(latent["samples"]),
        "empty_latent": {"width": WIDTH, "height": HEIGHT, "length": LENGTH, "batch_size": 1},
        "positive": pos_recipe,
        "negative": neg_recipe,
        "runs": runs,
    }


def case_i2v(c, folder: Path) -> dict:
    """HunyuanImageToVideo "v1 (concat)" on the 33-channel HunyuanVideo-I2V (no guidance input)."""
    cfg = TinyHunyuanVideo(in_channels=33, guidance=False)
    model, info = load_model(c, folder, cfg, "i2v")
    pos, pos_recipe = conditioning("i2v/positive", 9, cfg.text_dim)
    neg, neg_recipe = conditioning("i2v/negative", 5, cfg.text_dim)
    vae = StubVAE("i2v/vae", 16, 8)
    image, image_recipe = start_image("i2v/image", HEIGHT, WIDTH)
    pos2, latent = c.hunyuan.HunyuanImageToVideo().encode(
        pos, vae, WIDTH, HEIGHT, LENGTH, 1, "v1 (concat)", start_image=image
    )
    extras = pos2[0][1]
    out = ksampler(c, model, 3, 3, 2.5, "euler", "simple", pos2, neg, latent)
    return {
        "model": info,
        "positive": pos_recipe,
        "negative": neg_recipe,
        "start_image": image_recipe,
        "image_to_video": {"width": WIDTH, "height": HEIGHT, "length": LENGTH, "batch_size": 1},
        "vae_encode": vae.calls,
        "concat_latent_image": tensor_json(extras["concat_latent_image"]),
        "concat_mask": tensor_json(extras["concat_mask"]),
        "latent": tensor_json(latent["samples"]),
        "seed": 3,
        "steps": 3,
        "cfg": 2.5,
        "sampler": "euler",
        "scheduler": "simple",
        "output": tensor_json(out["samples"]),
    }


def case_vae(c: SimpleNamespace) -> dict:
    """ComfyUI's HunyuanVideo VAE decode (its 3-D LDM ``AutoencoderKL`` + VAEDecode's output conversion)."""
    vae = c.autoencoder.AutoencoderKL(ddconfig=dict(VAE_CONFIG), embed_dim=16).eval()
    shapes = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    vae.load_state_dict({k: vae_weight(k, s) for k, s in shapes.items()})
    latent_shape = (1, 16, 3, 5, 6)
    latent = hashed_uniform("hunyuan_vae/latent", latent_shape, 2.0)
    decoded = vae.decode(latent).float()
    image = torch.clamp((decoded + 1.0) / 2.0, min=0.0, max=1.0)  # comfy.sd.VAE.process_output
    image = image.movedim(1, -1).reshape(-1, *image.shape[-2:], image.shape[1])  # VAEDecode: [B*T, H, W, 3]
    return {
        "module": "comfy.ldm.models.autoencoder.AutoencoderKL",
        "ddconfig": VAE_CONFIG,
        "tensors": {k: list(s) for k, s in shapes.items()},
        "latent": {"name": "hunyuan_vae/latent", "shape": list(latent_shape), "scale": 2.0},
        "image": tensor_json(image, 7),  # IMAGE values in 0..1: 7 digits keep 1e-7
    }


def latent_format() -> dict:
    import comfy.latent_formats as formats

    fmt = formats.HunyuanVideo()
    return {
        "channels": fmt.latent_channels,
        "dimensions": fmt.latent_dimensions,
        "scale_factor": float(fmt.scale_factor),
        "shift_factor": float(getattr(fmt, "shift_factor", 0.0)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=COMFY_COMMIT)
    here = Path(__file__).resolve().parent
    parser.add_argument("--out", type=Path, default=here / "comfy_hunyuan_video_reference.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory(prefix="comfy-hunyuan-ref-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        ref = {
            "source": {
                "comfyui_commit": args.commit,
                "script": "tests/data/make_comfy_hunyuan_video_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/hunyuan_video_tiny_weights.py (hashed_uniform; digests below)",
            },
            "t2v": case_t2v(c, folder),
            "i2v": case_i2v(c, folder),
            "vae": case_vae(c),
            "latent_format": latent_format(),
        }
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
