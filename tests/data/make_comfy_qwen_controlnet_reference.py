"""Regenerate tests/data/comfy_qwen_controlnet_reference.json with ComfyUI 0.3.64's OWN ControlNet graph for an
InstantX Qwen-Image ControlNet.

Run by hand (not in CI) with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_qwen_controlnet_reference.py --comfy /work/shared/ComfyUI

The graph per case: ``UNETLoader``'s loader (tests/data/tiny_qwen_image_bf16.safetensors, the tiny Qwen-Image of
make_comfy_qwen_image_reference.py, loaded as that script loads it: the tiny widths added to detection) ->
``ControlNetLoader`` (tests/data/tiny_qwen_controlnet_instantx.safetensors, the tiny InstantX file
tests/controlnet_files.py builds, copied into a private models/controlnet; ComfyUI's ``load_controlnet_qwen_instantx``
reads it, the same tiny widths added to its detection) -> ``ControlNetApplyAdvanced`` (image, strength, start/end
percent, VAE) on positive and negative, chained when a case applies two -> ``KSampler``. The VAE on the apply node is
tests/data/controlnet_hint_vae.py's stand-in with a frame axis, as Qwen-Image's Wan VAE encodes an image to
[B, 16, 1, h, w] (ComfyUI's Qwen-Image VAE is full size). Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
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
from make_comfy_qwen_image_reference import FILES, TINY_WIDTHS, comfy_commit  # noqa: E402

MODEL_FILE = FILES["bf16"]
CONTROLNET_FILE = "tiny_qwen_controlnet_instantx.safetensors"
JSON_NAME = "comfy_qwen_controlnet_reference.json"
HINTS = {"edges": (1, 36, 60), "depth": (2, 72, 52)}  # name -> (seed, height, width): other sizes than the latent's
TEXT = {"pos7": 7, "neg5": 5, "pos6": 6, "neg6": 6}  # name -> tokens
# name, what, positive, negative, latent [B, 16, h, w], cfg, steps, [(hint, strength, start, end)]
CASES = (
    (
        "canny_cfg",
        "0.8 over the whole run, cfg 2.5, texts of 7 and 5 tokens (branches run apart)",
        "pos7",
        "neg5",
        [1, 16, 8, 12],
        2.5,
        4,
        [("edges", 0.8, 0.0, 1.0)],
    ),
    (
        "depth_batched",
        "1.0, cfg 2, both texts 6 tokens (one batch, one ControlNet call)",
        "pos6",
        "neg6",
        [1, 16, 8, 12],
        2.0,
        4,
        [("depth", 1.0, 0.0, 1.0)],
    ),
    (
        "chained",
        "depth 0.7 over 0..0.6, then edges 0.5 over 0.3..1, cfg 1.5",
        "pos7",
        "neg5",
        [1, 16, 8, 12],
        1.5,
        5,
        [("depth", 0.7, 0.0, 0.6), ("edges", 0.5, 0.3, 1.0)],
    ),
    (
        "odd_grid_cfg1",
        "1.2 on a 5x3-token grid, cfg 1 (the negative never runs)",
        "pos7",
        "neg5",
        [1, 16, 10, 6],
        1.0,
        3,
        [("edges", 1.2, 0.0, 1.0)],
    ),
)


def tiny_detection(detection):
    """detect_unet_config with the tiny widths added for Qwen-Image (ComfyUI reads the 20B model's defaults)."""
    real = detection.detect_unet_config

    def detect(state_dict, key_prefix, metadata=None):
        config = real(state_dict, key_prefix, metadata=metadata)
        if config is not None and config.get("image_model") == "qwen_image":
            config = {**config, **TINY_WIDTHS, "axes_dims_rope": list(TINY_WIDTHS["axes_dims_rope"])}
        return config

    return mock.patch.object(detection, "detect_unet_config", detect)


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
        tensors[f"text.{name}"] = torch.randn(1, tokens, TINY_WIDTHS["joint_attention_dim"], generator=gen)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base:
        (Path(base) / "models" / "controlnet").mkdir(parents=True)
        shutil.copy(HERE / CONTROLNET_FILE, Path(base) / "models" / "controlnet" / CONTROLNET_FILE)
        prepare_comfy(comfy_dir, Path(base))
        import comfy.model_detection
        import comfy.sd
        import comfy.utils

        import nodes

        comfy.utils.PROGRESS_BAR_ENABLED = False
        with tiny_detection(comfy.model_detection):
            model = comfy.sd.load_diffusion_model(str(HERE / MODEL_FILE))
            (controlnet,) = nodes.ControlNetLoader().load_controlnet(CONTROLNET_FILE)
        net = controlnet.control_model
        loaded = set(net.state_dict())
        from safetensors.torch import load_file

        stored = set(load_file(str(HERE / CONTROLNET_FILE)))
        assert stored <= loaded and not (loaded - stored), stored ^ loaded
        control_model = (
            f"{type(net).__name__}(blocks={len(net.transformer_blocks)}, main_model_double={net.main_model_double})"
        )
        images = {name: hint_image(*spec) for name, spec in HINTS.items()}
        for name, image in images.items():
            tensors[f"hint.{name}"] = image
        for name, what, pos, neg, latent_shape, cfg, steps, applies in CASES:
            positive, negative = [[tensors[f"text.{pos}"], {}]], [[tensors[f"text.{neg}"], {}]]
            vae = HintVAE(frame_axis=True)
            for hint, strength, start, end in applies:
                positive, negative = nodes.ControlNetApplyAdvanced().apply_controlnet(
                    positive, negative, controlnet, images[hint], strength, start, end, vae=vae
                )
            latent = {"samples": torch.zeros(latent_shape)}
            with torch.no_grad():
                (out,) = nodes.KSampler().sample(
                    model, 7, steps, cfg, "euler", "simple", positive, negative, latent, denoise=1.0
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
                    "applies": [dict(zip(("hint", "strength", "start_percent", "end_percent"), a)) for a in applies],
                    "vae_encode_calls": vae.calls,
                }
            )
            print(f"{name:16s} ok {tuple(out['samples'].shape)} vae calls {vae.calls}")
    reference = {
        "generator": "tests/data/make_comfy_qwen_controlnet_reference.py",
        "comfyui_commit": comfy_commit(comfy_dir),
        "torch": torch.__version__,
        "model_file": MODEL_FILE,
        "model_sha256": hashlib.sha256((HERE / MODEL_FILE).read_bytes()).hexdigest(),
        "controlnet_file": CONTROLNET_FILE,
        "controlnet_sha256": hashlib.sha256((HERE / CONTROLNET_FILE).read_bytes()).hexdigest(),
        "controlnet_dtype": str(net.dtype) if hasattr(net, "dtype") else "",
        "controlnet_model": control_model,
        "cases": records,
        "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
    }
    out_path = HERE / JSON_NAME
    out_path.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
