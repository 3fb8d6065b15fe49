"""Regenerate tests/data/comfy_qwen_controlnet_inpaint_reference.json with ComfyUI 0.3.64's OWN graph for the
InstantX Qwen-Image inpainting ControlNet (68 hint values per token: the latent's 64 and 4 of a mask channel).

Run by hand (not in CI) with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_qwen_controlnet_inpaint_reference.py --comfy /work/shared/ComfyUI

The graph per case: ``UNETLoader``'s loader (the tiny Qwen-Image, as make_comfy_qwen_controlnet_reference.py loads
it) -> ``ControlNetLoader`` (tests/data/tiny_qwen_controlnet_instantx_inpaint.safetensors, which
tests/controlnet_files.py builds; ComfyUI's ``load_controlnet_qwen_instantx`` sees 68 values and sets
``concat_mask``) -> ``ControlNetInpaintingAliMamaApply`` (image, MASK, strength, start/end percent, the hint VAE
stand-in) or, for one case, ``ControlNetApplyAdvanced`` (no mask) -> ``KSampler``. What the apply node hands the
CONTROL_NET (``set_cond_hint``'s image and ``extra_concat``) is recorded too, so the tests configure Parallel
ControlNet Loader's CONTROL_NET with exactly those. Nothing from this repository's engine is imported.
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

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from controlnet_hint_vae import HintVAE, hint_image  # noqa: E402
from make_comfy_qwen_controlnet_reference import MODEL_FILE, tiny_detection  # noqa: E402
from make_comfy_qwen_image_reference import TINY_WIDTHS, comfy_commit  # noqa: E402

CONTROLNET_FILE = "tiny_qwen_controlnet_instantx_inpaint.safetensors"
JSON_NAME = "comfy_qwen_controlnet_inpaint_reference.json"
TEXT = {"pos7": 7, "neg5": 5, "pos6": 6, "neg6": 6}  # name -> tokens


def box_mask(height: int, width: int) -> torch.Tensor:
    """A MASK [1, H, W]: 1 (inpaint) in a box right of centre, 0 elsewhere."""
    mask = torch.zeros(1, height, width)
    mask[:, height // 4 : 3 * height // 4, width // 3 : 5 * width // 6] = 1.0
    return mask


def soft_mask(height: int, width: int) -> torch.Tensor:
    """A MASK [1, H, W] rising smoothly from the left edge (0) to the right (1)."""
    return torch.linspace(0, 1, width)[None, None, :].expand(1, height, width).contiguous()


# name, what, positive, negative, latent, cfg, steps, apply node, (hint seed, h, w), mask, strength, start, end
CASES = (
    (
        "box_cfg",
        "a box mask at the image's size, 0.9 over the whole run, cfg 2.5, texts of 7 and 5 tokens",
        "pos7",
        "neg5",
        [1, 16, 8, 12],
        2.5,
        4,
        "ControlNetInpaintingAliMamaApply",
        (1, 36, 60),
        ("box", 36, 60),
        0.9,
        0.0,
        1.0,
    ),
    (
        "soft_batched",
        "a soft mask at another size than the image's (stretched), 1.0 over 0..0.8, cfg 2, both texts 6 tokens",
        "pos6",
        "neg6",
        [1, 16, 8, 12],
        2.0,
        4,
        "ControlNetInpaintingAliMamaApply",
        (2, 72, 52),
        ("soft", 20, 30),
        1.0,
        0.0,
        0.8,
    ),
    (
        "no_mask_odd_cfg1",
        "ControlNetApplyAdvanced (no mask: all kept), 1.1 on a 5x3-token grid, cfg 1",
        "pos7",
        "neg5",
        [1, 16, 10, 6],
        1.0,
        3,
        "ControlNetApplyAdvanced",
        (1, 36, 60),
        None,
        1.1,
        0.0,
        1.0,
    ),
)
MASKS = {"box": box_mask, "soft": soft_mask}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    comfy_dir = args.comfy.resolve()
    torch.set_num_threads(1)
    tensors: dict[str, torch.Tensor] = {}
    records = []
    gen = torch.Generator().manual_seed(2027)
    for name, tokens in TEXT.items():
        tensors[f"text.{name}"] = torch.randn(1, tokens, TINY_WIDTHS["joint_attention_dim"], generator=gen)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base:
        (Path(base) / "models" / "controlnet").mkdir(parents=True)
        shutil.copy(HERE / CONTROLNET_FILE, Path(base) / "models" / "controlnet" / CONTROLNET_FILE)
        prepare_comfy(comfy_dir, Path(base))
        import comfy.controlnet
        import comfy.model_detection
        import comfy.sd
        import comfy.utils
        from comfy_extras.nodes_controlnet import ControlNetInpaintingAliMamaApply

        import nodes

        comfy.utils.PROGRESS_BAR_ENABLED = False
        with tiny_detection(comfy.model_detection):
            model = comfy.sd.load_diffusion_model(str(HERE / MODEL_FILE))
            (controlnet,) = nodes.ControlNetLoader().load_controlnet(CONTROLNET_FILE)
        assert controlnet.concat_mask, "ComfyUI did not take the tiny file for the inpainting ControlNet"
        net = controlnet.control_model
        assert net.controlnet_x_embedder.weight.shape[1] == 68
        seen: list[tuple] = []
        real_set = comfy.controlnet.ControlNet.set_cond_hint

        def recording(self, cond_hint, strength=1.0, timestep_percent_range=(0.0, 1.0), vae=None, extra_concat=()):
            seen.append((cond_hint.clone(), [c.clone() for c in extra_concat]))
            return real_set(self, cond_hint, strength, timestep_percent_range, vae=vae, extra_concat=list(extra_concat))

        comfy.controlnet.ControlNet.set_cond_hint = recording
        for name, what, pos, neg, latent_shape, cfg, steps, node, hint, mask, strength, start, end in CASES:
            positive, negative = [[tensors[f"text.{pos}"], {}]], [[tensors[f"text.{neg}"], {}]]
            vae = HintVAE(frame_axis=True)
            image = hint_image(*hint)
            seen.clear()
            if node == "ControlNetInpaintingAliMamaApply":
                mask_tensor = MASKS[mask[0]](*mask[1:])
                tensors[f"{name}.mask"] = mask_tensor
                positive, negative = ControlNetInpaintingAliMamaApply().apply_inpaint_controlnet(
                    positive, negative, controlnet, vae, image, mask_tensor, strength, start, end
                )
            else:
                positive, negative = nodes.ControlNetApplyAdvanced().apply_controlnet(
                    positive, negative, controlnet, image, strength, start, end, vae=vae
                )
            assert len(seen) == 1, len(seen)  # one copy shared by both branches
            tensors[f"{name}.cond_hint"] = seen[0][0]
            for k, extra in enumerate(seen[0][1]):
                tensors[f"{name}.extra_concat.{k}"] = extra
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
                    "node": node,
                    "positive": pos,
                    "negative": neg,
                    "latent_shape": latent_shape,
                    "cfg": cfg,
                    "steps": steps,
                    "seed": 7,
                    "sampler_name": "euler",
                    "scheduler": "simple",
                    "strength": strength,
                    "start_percent": start,
                    "end_percent": end,
                    "extra_concat": len(seen[0][1]),
                    "vae_encode_calls": vae.calls,
                }
            )
            print(f"{name:18s} ok {tuple(out['samples'].shape)} vae calls {vae.calls} extra {len(seen[0][1])}")
        comfy.controlnet.ControlNet.set_cond_hint = real_set
    reference = {
        "generator": "tests/data/make_comfy_qwen_controlnet_inpaint_reference.py",
        "comfyui_commit": comfy_commit(comfy_dir),
        "torch": torch.__version__,
        "model_file": MODEL_FILE,
        "model_sha256": hashlib.sha256((HERE / MODEL_FILE).read_bytes()).hexdigest(),
        "controlnet_file": CONTROLNET_FILE,
        "controlnet_sha256": hashlib.sha256((HERE / CONTROLNET_FILE).read_bytes()).hexdigest(),
        "controlnet_model": f"{type(net).__name__}(blocks={len(net.transformer_blocks)}, concat_mask=True)",
        "cases": records,
        "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
    }
    out_path = HERE / JSON_NAME
    out_path.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
