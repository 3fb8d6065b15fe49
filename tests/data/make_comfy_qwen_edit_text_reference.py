"""Regenerate tests/data/comfy_qwen_edit_text_reference.json with ComfyUI's OWN TextEncodeQwenImageEdit and
TextEncodeQwenImageEditPlus (the reference image(s) through Qwen2.5-VL's vision tower into the prompt).

Run by hand (not in CI) with the Python of ComfyUI's venv (tests/comfyui/comfy_env.py builds it):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_qwen_edit_text_reference.py \\
        [--comfy /work/shared/ComfyUI]

What it does, all on the CPU: saves the tiny Qwen2.5-VL of ``qwen_vl_tiny_weights`` (text + vision tower) as a
bf16 ComfyUI text-encoder file, loads it with ``comfy.sd.load_clip`` (type Qwen-Image) and runs both nodes (no
real VAE: a recording one whose ``encode`` keeps the pixels the node scaled for each reference latent) on the
images of ``qwen_vl_tiny_weights.smooth_image``; stores each CONDITIONING and a summary of those pixels.

Patched, all sizes: ComfyUI builds Qwen2.5-VL-7B's text config and a 1280-wide, 32-block vision tower
(full attention in blocks 7, 15, 23, 31) whatever the file holds, and recognises the model by a 512-wide
k_proj bias; the tiny sizes (``TinyQwenVL``) replace those. The text encoder runs in float32 (ComfyUI's
choice for a CPU; the file's bf16 is kept by ``llama_detect`` otherwise). Nothing from parallel_runtime is
imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from qwen_vl_tiny_weights import TinyQwenVL, comfy_state, smooth_image, state_digest  # noqa: E402

CASES = [  # node, prompt, images as (height, width, seed)
    {"name": "edit_one_image", "node": "TextEncodeQwenImageEdit", "prompt": "make the fox blue",
     "images": [[96, 160, 0]]},
    {"name": "edit_plus_two_images", "node": "TextEncodeQwenImageEditPlus",
     "prompt": "put the cat of picture 2 next to the fox", "images": [[200, 120, 1], [150, 150, 2]]},
    {"name": "edit_plus_three_images", "node": "TextEncodeQwenImageEditPlus", "prompt": "a collage",
     "images": [[64, 64, 3], [300, 100, 4], [90, 180, 5]]},
    {"name": "edit_plus_image2_only", "node": "TextEncodeQwenImageEditPlus", "prompt": "the same in winter",
     "images": [None, [120, 200, 6]]},
    {"name": "edit_plus_no_image", "node": "TextEncodeQwenImageEditPlus", "prompt": "a red fox", "images": []},
]  # fmt: skip


def load_clip(path: Path, cfg: TinyQwenVL):
    import comfy.sd
    import comfy.text_encoders.hunyuan_video
    import comfy.text_encoders.llama as llama
    import comfy.text_encoders.qwen_vl as qwen_vl

    @dataclasses.dataclass
    class TinyConfig(llama.Qwen25_7BVLI_Config):
        vocab_size: int = cfg.vocab
        hidden_size: int = cfg.width
        intermediate_size: int = cfg.ffn
        num_hidden_layers: int = cfg.layers
        num_attention_heads: int = cfg.heads
        num_key_value_heads: int = cfg.kv_heads
        head_dim = cfg.head_dim
        rope_dims = [cfg.head_dim // 6] * 3

    real_vision = qwen_vl.Qwen2VLVisionTransformer

    def tiny_vision(hidden_size, output_hidden_size, device=None, dtype=None, ops=None):
        tower = real_vision(
            hidden_size=cfg.vision_width,
            output_hidden_size=output_hidden_size,
            intermediate_size=cfg.vision_ffn,
            num_heads=cfg.vision_heads,
            num_layers=cfg.vision_layers,
            device=device,
            dtype=dtype,
            ops=ops,
        )
        tower.fullatt_block_indexes = list(cfg.vision_full_attention)
        return tower

    with (
        mock.patch.object(comfy.sd, "detect_te_model", lambda sd: comfy.sd.TEModel.QWEN25_7B),
        mock.patch.object(comfy.sd, "llama_detect", lambda data: {}),
        mock.patch.object(llama, "Qwen25_7BVLI_Config", TinyConfig),
        mock.patch.object(qwen_vl, "Qwen2VLVisionTransformer", tiny_vision),
    ):
        return comfy.sd.load_clip(ckpt_paths=[str(path)], clip_type=comfy.sd.CLIPType.QWEN_IMAGE)


class RecordingVAE:
    """Stands in for the VAE: keeps what the node encodes and returns it 8x smaller (a "latent")."""

    def __init__(self):
        self.seen = []

    def encode(self, pixels):
        self.seen.append(pixels.clone())
        return pixels.movedim(-1, 1)[:, :, ::8, ::8]


def pixel_summary(pixels: torch.Tensor) -> dict:
    flat = pixels.double().flatten()
    return {"shape": list(pixels.shape), "sum": float(flat.sum()), "sum_squares": float((flat * flat).sum()),
            "every_9973rd": tensor_json(flat[::9973].float(), digits=8)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        prepare_comfy(args.comfy.resolve(), Path(tmp))
        from comfy_extras import nodes_qwen

        cfg = TinyQwenVL()
        state = comfy_state(cfg)
        path = Path(tmp) / "qwen_2.5_vl_7b.safetensors"
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(path))
        clip = load_clip(path, cfg)
        results = []
        for case in CASES:
            node = getattr(nodes_qwen, case["node"])
            images = [None if spec is None else smooth_image(*spec) for spec in case["images"]]
            vae = RecordingVAE()
            if case["node"] == "TextEncodeQwenImageEdit":
                out = node.execute(clip, case["prompt"], vae=vae, image=images[0] if images else None)
            else:
                named = {f"image{i + 1}": im for i, im in enumerate(images)}
                out = node.execute(clip, case["prompt"], vae=vae, **named)
            ((cond, extra),) = out.result[0]
            assert "attention_mask" not in extra, extra.keys()
            assert len(extra.get("reference_latents", [])) == len(vae.seen)
            results.append(
                {
                    **case,
                    "conditioning": tensor_json(cond.float(), digits=7),
                    "vae_pixels": [pixel_summary(p) for p in vae.seen],
                }
            )
            print(f"{case['name']}: {list(cond.shape)} mean |x| {cond.float().abs().mean():.4f}")

    reference = {
        "generator": "tests/data/make_comfy_qwen_edit_text_reference.py",
        "torch": torch.__version__,
        "tiny": dataclasses.asdict(TinyQwenVL()),
        "state_digest": state_digest(state),
        "cases": results,
    }
    out_path = HERE / "comfy_qwen_edit_text_reference.json"
    out_path.write_text(json.dumps(reference) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
