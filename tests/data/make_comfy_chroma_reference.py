"""Regenerate tests/data/comfy_ref_chroma.safetensors and comfy_chroma_reference.json with ComfyUI's OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + ComfyUI's requirements):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_chroma_reference.py --comfy /work/shared/ComfyUI

1. Builds ComfyUI's own ``comfy.ldm.chroma.model.Chroma`` at tiny widths with the published block counts
   (19 double + 38 single): ComfyUI always builds a modulation table of 344 rows (3 x 38 + 12 x 19 + 2) and
   reads the output layer's rows at its end, so only these counts give the file the meaning it has in
   diffusers. Its tensors are filled with seeded values and saved in bf16: the state dict is Chroma's
   original layout (what ComfyUI reads from models/diffusion_models).
2. Loads it with ComfyUI's real loader (``comfy.sd.load_diffusion_model``, what UNETLoader calls; CPU, fp32)
   and records what ComfyUI derives from it (``supported_models.Chroma``: model sampling, latent format).
3. Runs ComfyUI's KSampler (``nodes.KSampler``) with ``FluxGuidance``, ``EmptyLatentImage`` and an image
   latent on fixed CONDITIONING (T5 token states of different lengths, as ComfyUI's unpadded T5 gives them),
   and one direct forward of the diffusion model.

The only patch is width: ComfyUI's detection (model_detection.py:199) hard-codes Chroma's published
widths (hidden 3072, 24 heads, T5 4096, approximator 64 -> 5120 x 5 -> 3072, rope 16/56/56); the wrapper
replaces exactly those numbers with the ones the weights show (recorded as ``detection_overrides``).
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

JSON_NAME = "comfy_chroma_reference.json"
FILE_NAME = "comfy_ref_chroma.safetensors"
CHROMA = {
    "hidden": 16,
    "head_dim": 8,
    "axes_dim": [4, 2, 2],
    "depth": 19,
    "depth_single": 38,
    "context": 32,
    "guide_in": 64,  # ComfyUI's fixed approximator input: 16 timestep + 16 guidance + 32 index features
    "guide_hidden": 48,
    "guide_layers": 2,
}
MODULATION_ROWS = 344  # comfy/ldm/chroma/model.py forward_orig: mod_index_length


def chroma_state(c) -> dict[str, torch.Tensor]:
    from comfy.ldm.chroma.model import Chroma

    assert 3 * CHROMA["depth_single"] + 12 * CHROMA["depth"] + 2 == MODULATION_ROWS
    with torch.device("cpu"):  # disable_weight_init: allocated, never initialised
        model = Chroma(
            in_channels=64,
            out_channels=64,
            context_in_dim=CHROMA["context"],
            hidden_size=CHROMA["hidden"],
            mlp_ratio=4.0,
            num_heads=CHROMA["hidden"] // CHROMA["head_dim"],
            depth=CHROMA["depth"],
            depth_single_blocks=CHROMA["depth_single"],
            axes_dim=CHROMA["axes_dim"],
            theta=10000,
            patch_size=2,
            qkv_bias=True,
            in_dim=CHROMA["guide_in"],
            out_dim=CHROMA["hidden"],
            hidden_dim=CHROMA["guide_hidden"],
            n_layers=CHROMA["guide_layers"],
            operations=c.comfy.ops.disable_weight_init,
        )
    return {k: v.to(torch.bfloat16) for k, v in fill_state(meta_shapes(model)).items()}


def detection_overrides(c) -> dict:
    """Wrap ComfyUI's detect_unet_config: Chroma's hard-coded widths -> those the weights show."""
    original = c.detection.detect_unet_config
    applied: dict = {}

    def detect(state_dict, key_prefix, metadata=None):
        config = original(state_dict, key_prefix, metadata=metadata)
        if config is not None and config.get("image_model") == "chroma":
            hidden = state_dict[f"{key_prefix}img_in.weight"].shape[0]
            head_dim = state_dict[f"{key_prefix}double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
            guide = state_dict[f"{key_prefix}distilled_guidance_layer.in_proj.weight"]
            changes = {
                "hidden_size": hidden,
                "num_heads": hidden // head_dim,
                "context_in_dim": state_dict[f"{key_prefix}txt_in.weight"].shape[1],
                "axes_dim": list(CHROMA["axes_dim"]),
                "in_dim": guide.shape[1],
                "hidden_dim": guide.shape[0],
                "out_dim": hidden,
                "n_layers": CHROMA["guide_layers"],
            }
            config.update(changes)
            applied.update(changes)
        return config

    c.detection.detect_unet_config = detect
    return applied


def save_and_load(c, state: dict[str, torch.Tensor], out_dir: Path):
    from safetensors.torch import save_file

    path = out_dir / FILE_NAME
    save_file(state, str(path))
    model = c.comfy.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
    loaded = model.model.diffusion_model.state_dict()
    for key, value in state.items():
        if key not in loaded or not torch.equal(loaded[key].float(), value.float()):
            raise SystemExit(f"tensor {key} did not load into ComfyUI's Chroma")
    missing = set(loaded) - set(state)
    if missing:
        raise SystemExit(f"ComfyUI's Chroma has tensors the file lacks: {sorted(missing)[:5]}")
    if type(model.model.diffusion_model).__name__ != "Chroma":
        raise SystemExit(f"ComfyUI detected {type(model.model.diffusion_model).__name__}, not Chroma")
    return path, model


class T5Builder(Builder):
    """CONDITIONING as CLIPTextEncode gives it for a T5-only model: the options hold pooled_output None (the
    key must be there: model_base.Flux.encode_adm reads it)."""

    def text(self, name: str, tokens: int, width: int, pooled: int | None = None) -> list:
        (entry,) = super().text(name, tokens, width, None)
        entry[1]["pooled_output"] = None
        return [entry]

    def record(self, cond: list) -> list[dict]:
        return super().record([[e[0], {k: v for k, v in e[1].items() if v is not None}, e[2]] for e in cond])


def chroma_cases(c, b: Builder) -> list[dict]:
    ctx = CHROMA["context"]
    pos, neg, neg7 = (b.text(n, t, ctx, None) for n, t in (("chroma_pos", 7), ("chroma_neg", 2), ("chroma_neg7", 7)))
    empty = b.empty_latent(64, 48)  # 4-channel zeros, 6x8 latent; KSampler widens it to 16 channels
    image = b.image_latent("chroma_image", 16, 6, 8)
    mk = maker({"model": "chroma", "seed": 13, "steps": 4, "cfg": 4.0, "sampler_name": "euler", "scheduler": "simple"})
    # fmt: off
    return [
        mk("chroma_default_euler", "UNETLoader -> KSampler: shift 1.15, guidance 0; 7 vs 2 tokens", pos, neg, empty),
        mk("chroma_same_lengths_dpmpp_2m", "7 vs 7 tokens (one batch), dpmpp_2m, beta", pos, neg7, empty,
           sampler_name="dpmpp_2m", scheduler="beta"),
        mk("chroma_flux_guidance", "FluxGuidance 3.0 on the positive only (negative 0)", b.guidance(pos, 3.0), neg,
           empty, cfg=3.0),
        mk("chroma_image_denoise", "non-zero latent, denoise 0.6, heun", pos, neg, image, denoise=0.6,
           sampler_name="heun"),
        mk("chroma_cfg1_ancestral", "cfg 1 (no negative pass), euler_ancestral", pos, neg, empty, cfg=1.0,
           sampler_name="euler_ancestral", seed=21),
        mk("chroma_odd_size", "72x56 px: padded and cropped", pos, neg, b.empty_latent(72, 56), steps=3),
    ]
    # fmt: on


def direct_forward(model, b: Builder) -> dict:
    """One call of ComfyUI's Chroma forward (x, sigma, T5 states, guidance) -> its output."""
    x, context = randn("forward/x", (1, 16, 6, 8)), randn("forward/context", (1, 5, CHROMA["context"]))
    sigma, guidance = 0.625, 2.5
    with torch.no_grad():
        out = model.model.diffusion_model(x, torch.tensor([sigma]), context, torch.tensor([guidance]))
    return {
        "x": b.tensor("forward.x", x),
        "context": b.tensor("forward.context", context),
        "sigma": sigma,
        "guidance": guidance,
        "out": b.tensor("forward.out", out),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)  # reduction order independent of the machine's cores
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        overrides = detection_overrides(c)
        b = T5Builder(c)
        path, model = save_and_load(c, chroma_state(c), args.out)
        info = {
            "file": path.name,
            "bytes": path.stat().st_size,
            "storage_dtype": "bfloat16",
            "structure": CHROMA,
            "detection_overrides": overrides,
            "comfy": describe_model(model),
        }
        records = [run_case(c, b, {"chroma": model}, case) for case in chroma_cases(c, b)]
        forward = direct_forward(model, b)
        reference = {
            "generator": "tests/data/make_comfy_chroma_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "conventions": {
                "guidance": "model_base.py:1388 Chroma.extra_conds: guidance = options.get('guidance', 0) per entry",
                "token_counts": "Flux.extra_conds wraps the text as CONDRegular: different lengths run as "
                "separate model calls (conds.py:17)",
                "modulations": "chroma/model.py forward_orig: a 344-row table, rows by block index, final = last 2",
            },
            "models": {"chroma": info},
            "cases": records,
            "forward": forward,
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
        print(f"{r['name']:35s} {r['model_sampling_in_force']} {status}")
    print(f"wrote {out} ({out.stat().st_size} bytes), {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
