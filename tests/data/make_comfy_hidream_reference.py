"""Regenerate tests/data/comfy_ref_hidream.safetensors and comfy_hidream_reference.json with ComfyUI's OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + ComfyUI's requirements):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_hidream_reference.py --comfy /work/shared/ComfyUI

1. Builds ComfyUI's own ``comfy.ldm.hidream.model.HiDreamImageTransformer2DModel`` at tiny widths (2 double +
   2 single blocks, 2 heads of 16, 4 routed experts of which 2 are active, T5 32 / Llama 24 / pooled 20 wide);
   its tensors are filled with seeded values and saved in fp16: the state dict is the release's layout (what
   ComfyUI reads from models/diffusion_models).
2. Loads it with ComfyUI's real loader (``comfy.sd.load_diffusion_model``, what UNETLoader calls; CPU, fp32)
   and records what ComfyUI derives from it (``supported_models.HiDream``: model sampling, latent format).
3. Runs ComfyUI's KSampler (``nodes.KSampler``, ``ModelSamplingSD3``, ``EmptyLatentImage``) on fixed
   CONDITIONING as QuadrupleCLIPLoader + CLIPTextEncode give it: T5 states, pooled CLIP-L + CLIP-G and
   ``conditioning_llama3`` (every Llama layer's states, [1, layers, tokens, width]); ComfyUI's Llama tokenizer
   file is missing from the snapshot, so the encoders are not run (COMFYUI.md). Also one direct forward.

The only patch is width: ComfyUI's detection (model_detection.py:453) hard-codes HiDream's published config
(20 heads of 128, rope 64/32/32, 16 + 32 blocks, text widths 4096 / 2048, Llama layers 0-31 then 31); the
wrapper replaces exactly those numbers with the tiny ones (recorded as ``detection_overrides``), keeping the
published rule that block k reads Llama layer min(k, 31). Nothing from parallel_runtime is imported.
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

JSON_NAME = "comfy_hidream_reference.json"
FILE_NAME = "comfy_ref_hidream.safetensors"
HIDREAM = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 16,
    "num_layers": 2,
    "num_single_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 2,
    "caption_channels": [32, 24],  # T5, Llama
    "text_emb_dim": 20,
    "num_routed_experts": 4,
    "num_activated_experts": 2,
    "axes_dims_rope": [8, 4, 4],
    "max_resolution": [128, 128],
    "llama_layers": [0, 1, 2, 3],
}
LLAMA_LAYERS = 4  # the states CLIPTextEncode would give hold this many layers here (32 for Llama-3.1 8B)


def hidream_state(c) -> dict[str, torch.Tensor]:
    from comfy.ldm.hidream.model import HiDreamImageTransformer2DModel

    with torch.device("cpu"):  # disable_weight_init: allocated, never initialised
        model = HiDreamImageTransformer2DModel(**HIDREAM, operations=c.comfy.ops.disable_weight_init)
    return fill_state(meta_shapes(model))


def detection_overrides(c) -> dict:
    """Wrap ComfyUI's detect_unet_config: HiDream's hard-coded config -> the tiny one."""
    original = c.detection.detect_unet_config
    applied: dict = {}

    def detect(state_dict, key_prefix, metadata=None):
        config = original(state_dict, key_prefix, metadata=metadata)
        if config is not None and config.get("image_model") == "hidream":
            changes = {k: v for k, v in HIDREAM.items() if config.get(k) != v}
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
            raise SystemExit(f"tensor {key} did not load into ComfyUI's HiDream")
    missing = set(loaded) - set(state)
    if missing:
        raise SystemExit(f"ComfyUI's HiDream has tensors the file lacks: {sorted(missing)[:5]}")
    if type(model.model).__name__ != "HiDream":
        raise SystemExit(f"ComfyUI detected {type(model.model).__name__}, not HiDream")
    return path, model


class QuadBuilder(Builder):
    """CONDITIONING as QuadrupleCLIPLoader + CLIPTextEncode give it: T5 states, pooled CLIPs, Llama states."""

    def hidream_text(self, name: str, t5_tokens: int, llama_tokens: int) -> list:
        (entry,) = self.text(name, t5_tokens, HIDREAM["caption_channels"][0], HIDREAM["text_emb_dim"])
        llama = randn(f"llama3/{name}", (1, LLAMA_LAYERS, llama_tokens, HIDREAM["caption_channels"][1]))
        entry[1]["conditioning_llama3"] = llama
        self.tensor(f"{name}.llama3", llama)
        return [entry]

    def record(self, cond: list) -> list[dict]:
        out = super().record(cond)
        for entry, (_, options, name) in zip(out, cond):
            if "conditioning_llama3" in options:
                entry["llama3"] = f"{name}.llama3"
        return out


def hidream_cases(c, b: QuadBuilder) -> list[dict]:
    pos, neg = b.hidream_text("hidream_pos", 7, 6), b.hidream_text("hidream_neg", 3, 4)
    empty = b.empty_latent(64, 64)  # 4-channel zeros; KSampler widens it to 16 channels
    mk = maker({"model": "hidream", "seed": 17, "steps": 4, "cfg": 5.0, "sampler_name": "euler", "scheduler": "simple"})
    sd3 = lambda shift: {"node": "ModelSamplingSD3", "inputs": {"shift": shift}}  # noqa: E731
    # fmt: off
    return [
        mk("hidream_default_euler", "UNETLoader -> KSampler: shift 1.0 (the file's default), cfg 5", pos, neg, empty),
        mk("hidream_full_shift3_dpmpp_2m", "ModelSamplingSD3 3.0 (Full's workflow), dpmpp_2m, 64x48 px", pos, neg,
           b.empty_latent(64, 48), model_sampling=sd3(3.0), sampler_name="dpmpp_2m"),
        mk("hidream_dev_cfg1", "ModelSamplingSD3 6.0, cfg 1 (Dev / Fast: no negative pass)", pos, neg, empty,
           model_sampling=sd3(6.0), cfg=1.0, seed=23),
        mk("hidream_odd_size", "72x56 px: padded and cropped", pos, neg, b.empty_latent(72, 56), steps=3),
    ]
    # fmt: on


def direct_forward(model, b: Builder) -> dict:
    """One call of ComfyUI's HiDream forward (x, t = sigma x 1000, pooled, T5, Llama) -> its output."""
    x = randn("forward/x", (1, 16, 6, 8))
    context = randn("forward/context", (1, 5, HIDREAM["caption_channels"][0]))
    llama = randn("forward/llama3", (1, LLAMA_LAYERS, 4, HIDREAM["caption_channels"][1]))
    pooled = randn("forward/pooled", (1, HIDREAM["text_emb_dim"]))
    sigma = 0.625
    with torch.no_grad():
        out = model.model.diffusion_model(x, torch.tensor([sigma * 1000]), pooled, context, llama)
    return {
        "x": b.tensor("forward.x", x),
        "context": b.tensor("forward.context", context),
        "llama3": b.tensor("forward.llama3", llama),
        "pooled": b.tensor("forward.pooled", pooled),
        "sigma": sigma,
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
        b = QuadBuilder(c)
        path, model = save_and_load(c, hidream_state(c), args.out)
        info = {
            "file": path.name,
            "bytes": path.stat().st_size,
            "storage_dtype": "float16",
            "structure": HIDREAM,
            "detection_overrides": overrides,
            "comfy": describe_model(model),
        }
        records = [run_case(c, b, {"hidream": model}, case) for case in hidream_cases(c, b)]
        forward = direct_forward(model, b)
        reference = {
            "generator": "tests/data/make_comfy_hidream_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "conventions": {
                "sampling": "supported_models.py:1183 HiDream.sampling_settings = {} (the shift 3.0 above it is "
                "overwritten): ModelSamplingDiscreteFlow shift 1.0, multiplier 1000",
                "llama3": "model_base.py:1373 HiDream.extra_conds: conditioning_llama3 [B, layers, tokens, width] "
                "-> encoder_hidden_states_llama3; block k reads layer llama_layers[k]",
                "output": "hidream/model.py _forward returns the negated output",
            },
            "models": {"hidream": info},
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
