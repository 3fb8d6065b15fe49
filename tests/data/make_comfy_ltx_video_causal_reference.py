"""Regenerate tests/data/comfy_ltx_video_causal_reference.json: ComfyUI's OWN LTX-Video code on a tiny file whose
``config`` metadata (what Lightricks' 0.9.5+ releases embed) turns on causal time positions.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_ltx_video_causal_reference.py \
        /work/shared/ComfyUI

ComfyUI 0.3.64 reads a checkpoint's safetensors metadata only in CheckpointLoaderSimple's path
(``comfy.sd.load_checkpoint_guess_config``: ``model_detection`` merges ``config``'s ``transformer`` entries into
the LTXV model's arguments, ``causal_temporal_positioning`` among them); UNETLoader's ``load_diffusion_model``
reads no metadata. The tiny file (``ltx_video_tiny_weights``, under ``model.diffusion_model.``) is loaded the
first way, fp32 on the CPU, and sampled with ``KSampler`` on ``EmptyLTXVLatentVideo`` with ``LTXVConditioning``;
the CONDITIONING tensors are the ones of ``make_comfy_ltx_video_reference.py``. The same file through UNETLoader
is stored too (``unet_loader``): what ComfyUI 0.3.64 gives when the metadata is not read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import tensor_json  # noqa: E402
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from make_comfy_ltx_video_reference import HEIGHT, LENGTH, PREFIX, WIDTH, conditioning, import_comfy, node  # noqa: E402
from make_comfy_wan_reference import COMFY_COMMIT, dump_json  # noqa: E402
from wan_tiny_weights import state_digest  # noqa: E402

SALT = "causal"


def release_metadata(cfg: TinyLTXVideo) -> dict[str, str]:
    """A ``config`` metadata entry shaped like Lightricks' 0.9.5 release's (its transformer part, tiny sizes)."""
    transformer = {
        "_class_name": "Transformer3DModel",
        "activation_fn": "gelu-approximate",
        "attention_bias": True,
        "attention_head_dim": cfg.head_dim,
        "caption_channels": cfg.text_dim,
        "cross_attention_dim": cfg.width,
        "in_channels": cfg.channels,
        "norm_eps": 1e-06,
        "num_attention_heads": 32,
        "num_layers": cfg.blocks,
        "out_channels": cfg.channels,
        "positional_embedding_max_pos": [20, 2048, 2048],
        "positional_embedding_theta": 10000.0,
        "positional_embedding_type": "rope",
        "qk_norm": "rms_norm",
        "timestep_scale_multiplier": 1000,
        "causal_temporal_positioning": True,
    }
    return {"config": json.dumps({"transformer": transformer})}


def inputs(c, cfg: TinyLTXVideo) -> tuple[dict, list, list, dict]:
    """(LATENT, positive, negative, their recipes)."""
    (latent,) = node(c.lt.EmptyLTXVLatentVideo, WIDTH, HEIGHT, LENGTH, 1)
    pos, pos_recipe = conditioning("ltx/positive", 12, 9, cfg.text_dim)
    neg, neg_recipe = conditioning("ltx/negative", 12, 12, cfg.text_dim)
    positive, negative = node(c.lt.LTXVConditioning, pos, neg, 24.0)
    return latent, positive, negative, {"positive": pos_recipe, "negative": neg_recipe}


def sample(c, model, cfg: TinyLTXVideo) -> dict:
    latent, positive, negative, _ = inputs(c, cfg)
    (out,) = c.nodes.KSampler().sample(model, 3, 3, 3.0, "euler", "simple", positive, negative, latent)
    return tensor_json(out["samples"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=COMFY_COMMIT)
    here = Path(__file__).resolve().parent
    parser.add_argument("--out", type=Path, default=here / "comfy_ltx_video_causal_reference.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="comfy-ltx-causal-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        cfg = TinyLTXVideo()
        sd = tiny_ltx_video_state_dict(cfg, SALT)
        metadata = release_metadata(cfg)
        path = folder / "tiny_ltx_video_causal.safetensors"
        save_file({PREFIX + k: v for k, v in sd.items()}, str(path), metadata=metadata)
        checkpoint, *_ = c.sd.load_checkpoint_guess_config(
            str(path), output_vae=False, output_clip=False, model_options={"dtype": torch.float32}
        )
        causal = bool(checkpoint.model.diffusion_model.causal_temporal_positioning)
        assert causal, "CheckpointLoaderSimple's path did not read the causal flag from the metadata"
        unet = c.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
        assert not unet.model.diffusion_model.causal_temporal_positioning
        ref = {
            "source": {
                "comfyui_commit": args.commit,
                "script": "tests/data/make_comfy_ltx_video_causal_reference.py",
                "torch": torch.__version__,
                "weights": "tests/data/ltx_video_tiny_weights.py (hashed_uniform; digest below)",
            },
            "model": {
                "config": {
                    "head_dim": cfg.head_dim,
                    "blocks": cfg.blocks,
                    "channels": cfg.channels,
                    "text_dim": cfg.text_dim,
                },
                "salt": SALT,
                "digest": state_digest(sd),
            },  # fmt: skip
            "metadata": metadata,
            "latent": tensor_json(inputs(c, cfg)[0]["samples"]),
            **inputs(c, cfg)[3],
            "sampling": {
                "seed": 3,
                "steps": 3,
                "cfg": 3.0,
                "sampler": "euler",
                "scheduler": "simple",
                "frame_rate": 24.0,
                "width": WIDTH,
                "height": HEIGHT,
                "length": LENGTH,
            },  # fmt: skip
            "checkpoint_loader": {"causal_temporal_positioning": causal, "output": sample(c, checkpoint, cfg)},
            "unet_loader": {"causal_temporal_positioning": False, "output": sample(c, unet, cfg)},
        }
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
