"""Regenerate tests/data/comfy_ref_sd35_{large,medium}.safetensors and comfy_sd35_reference.json with ComfyUI's
OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + ComfyUI's requirements):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_sd35_reference.py --comfy /work/shared/ComfyUI

1. Builds ComfyUI's own MMDiT (``OpenAISignatureMMDITWrapper``) at a tiny width in the two SD3.5 structures:
   Large (RMS q/k norms in every attention) and Medium (MMDiT-X: the same norms plus a second image
   self-attention in the first blocks, ``x_block_self_attn_layers``). Its tensors are filled with seeded values
   and saved in bf16 under ``model.diffusion_model.``, the names of Stability's sd3.5_large.safetensors /
   sd3.5_medium.safetensors.
2. Loads each with ComfyUI's real loader (``comfy.sd.load_diffusion_model``, what UNETLoader calls; CPU, fp32),
   checks that ComfyUI detected the structure (qk_norm "rms", the dual-attention layers) and records what it
   derives from the file (``supported_models.SD3``: discrete flow shift 3.0, the SD3 latent format).
3. Runs ComfyUI's KSampler (``nodes.KSampler``, ``ModelSamplingSD3``) on fixed CONDITIONING (CLIP + T5 token
   states with pooled vectors, as TripleCLIPLoader + CLIPTextEncode give them).

No detection patch is needed: MMDiT's width is 64 x depth, read from the weights.
Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_reference_models import describe_model, fill_state, import_comfy, meta_shapes, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from make_comfy_ksampler_reference import COMFY_COMMIT, Builder, maker, run_case  # noqa: E402

JSON_NAME = "comfy_sd35_reference.json"
PREFIX = "model.diffusion_model."  # Stability's single files
# depth 2: hidden 128 (MMDiT's 64 x depth), 2 heads of 64; the real Large has 38, Medium 24 with layers 0-12 dual
STRUCTURES = {
    "sd35_large": {"depth": 2, "context": 32, "adm": 24, "pos_embed_max_size": 8, "x_block_self_attn_layers": []},
    "sd35_medium": {"depth": 2, "context": 32, "adm": 24, "pos_embed_max_size": 8, "x_block_self_attn_layers": [0]},
}


def mmdit_state(c, s: dict) -> dict[str, torch.Tensor]:
    from comfy.ldm.modules.diffusionmodules.mmdit import OpenAISignatureMMDITWrapper

    hidden, n = 64 * s["depth"], s["pos_embed_max_size"]
    with torch.device("cpu"):  # disable_weight_init: allocated, never initialised
        model = OpenAISignatureMMDITWrapper(
            input_size=None,
            patch_size=2,
            in_channels=16,
            out_channels=16,
            depth=s["depth"],
            adm_in_channels=s["adm"],
            context_embedder_config={
                "target": "torch.nn.Linear",
                "params": {"in_features": s["context"], "out_features": hidden},
            },
            pos_embed_max_size=n,
            num_patches=n * n,
            pos_embed_scaling_factor=None,
            qk_norm="rms",
            x_block_self_attn_layers=list(s["x_block_self_attn_layers"]),
            operations=c.comfy.ops.disable_weight_init,
        )
    state = fill_state(meta_shapes(model))
    for name in state:  # RMS scales near 1 (fill_state's 1-D default is a bias-sized N(0, 0.02))
        if ".ln_q." in name or ".ln_k." in name:
            state[name] = (1.0 + randn(name, state[name].shape, 0.1)).to(torch.float16)
    return {PREFIX + k: v.to(torch.bfloat16) for k, v in state.items()}


def save_and_load(c, name: str, state: dict[str, torch.Tensor], s: dict, out_dir: Path):
    from safetensors.torch import save_file

    path = out_dir / f"comfy_ref_{name}.safetensors"
    save_file(state, str(path))
    model = c.comfy.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
    loaded = model.model.diffusion_model.state_dict()
    for key, value in state.items():
        bare = key[len(PREFIX) :]
        if bare not in loaded or not torch.equal(loaded[bare].float(), value.float()):
            raise SystemExit(f"{name}: tensor {key} did not load into ComfyUI's MMDiT")
    missing = set(loaded) - {k[len(PREFIX) :] for k in state}
    if missing:
        raise SystemExit(f"{name}: ComfyUI's MMDiT has tensors the file lacks: {sorted(missing)[:5]}")
    net = model.model.diffusion_model
    dual = sorted(i for i, b in enumerate(net.joint_blocks) if getattr(b.x_block, "x_block_self_attn", False))
    if dual != s["x_block_self_attn_layers"] or type(net.joint_blocks[0].x_block.attn.ln_q).__name__ != "RMSNorm":
        raise SystemExit(f"{name}: ComfyUI detected dual layers {dual}, not the file's structure")
    return path, model


def cases(b: Builder, name: str, s: dict) -> list[dict]:
    ctx, adm = s["context"], s["adm"]
    pos, neg, neg5 = (b.text(f"{name}_{n}", t, ctx, adm) for n, t in (("pos", 5), ("neg", 3), ("neg5", 5)))
    empty = b.empty_latent(64, 48)  # 4-channel zeros, 6x8 latent; KSampler widens it to 16 channels
    image = b.image_latent(f"{name}_image", 16, 6, 8)
    mk = maker({"model": name, "seed": 17, "steps": 4, "cfg": 4.5, "sampler_name": "euler", "scheduler": "simple"})
    shift = {"node": "ModelSamplingSD3", "inputs": {"shift": 5.0}}
    # fmt: off
    return [
        mk(f"{name}_default_euler", "UNETLoader -> KSampler: discrete flow shift 3.0; 5 vs 3 tokens", pos, neg, empty),
        mk(f"{name}_dpmpp_2m_sgm_uniform", "5 vs 5 tokens (one batch), dpmpp_2m, sgm_uniform", pos, neg5, empty,
           sampler_name="dpmpp_2m", scheduler="sgm_uniform"),
        mk(f"{name}_model_sampling_sd3", "ModelSamplingSD3(5.0), image latent, denoise 0.6, heun", pos, neg5, image,
           denoise=0.6, sampler_name="heun", model_sampling=shift),
        mk(f"{name}_odd_size", "72x56 px: padded and cropped", pos, neg, b.empty_latent(72, 56), steps=3),
    ]
    # fmt: on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)  # reduction order independent of the machine's cores
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        b = Builder(c)
        models, infos, all_cases, paths = {}, {}, [], []
        for name, s in STRUCTURES.items():
            path, model = save_and_load(c, name, mmdit_state(c, s), s, args.out)
            models[name] = model
            paths.append(path)
            infos[name] = {
                "file": path.name,
                "bytes": path.stat().st_size,
                "storage_dtype": "bfloat16",
                "prefix": PREFIX,
                "structure": {**s, "hidden": 64 * s["depth"], "qk_norm": "rms"},
                "comfy": describe_model(model),
            }
            all_cases += cases(b, name, s)
        records = [run_case(c, b, models, case) for case in all_cases]
        reference = {
            "generator": "tests/data/make_comfy_sd35_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "conventions": {
                "detection": "model_detection.py:40-79 mmdit: depth = x_embedder width / 64, qk_norm 'rms' when "
                "joint_blocks.0.context_block.attn.ln_q.weight exists, x_block_self_attn_layers from "
                "joint_blocks.N.x_block.attn2.qkv.weight",
                "token_counts": "SD3's text is CONDRegular: different lengths run as separate model calls",
            },
            "models": infos,
            "cases": records,
            "tensors": {k: tensor_json(v) for k, v in sorted(b.tensors.items())},
        }
    out = args.out / JSON_NAME
    tensors = reference.pop("tensors")
    compact = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in tensors.items())
    text = json.dumps(reference, indent=1)[:-2] + ',\n "tensors": {\n' + compact + "\n }\n}\n"
    json.loads(text)  # well-formed
    out.write_text(text, encoding="utf-8")
    for r in records:
        status = r.get("comfy_error") or f"ok {tuple(b.tensors[r['expected']['samples']].shape)}"
        print(f"{r['name']:40s} {r['model_sampling_in_force']} {status}")
    print(f"wrote {out} ({out.stat().st_size} bytes), " + ", ".join(f"{p} ({p.stat().st_size} bytes)" for p in paths))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
