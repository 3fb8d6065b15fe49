"""Regenerate tests/data/comfy_controlnet_reference.json with ComfyUI 0.3.64's OWN ControlNet graph.

Run by hand (not in CI) with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_controlnet_reference.py --comfy /work/shared/ComfyUI [--kind xlabs|mistoline]

``--kind xlabs`` writes tests/data/comfy_controlnet_xlabs_reference.json instead, for the tiny XLabs file
(tiny_flux_controlnet_xlabs.safetensors: two double blocks, a pixel hint, no union type; ComfyUI's
``load_controlnet_flux_xlabs_mistoline``); its apply node gets the same VAE, which ComfyUI leaves unused there.
``--kind mistoline`` writes tests/data/comfy_controlnet_mistoline_reference.json, for the tiny Mistoline file
(tiny_flux_controlnet_mistoline.safetensors: two double and three single blocks, the same loader with
``mistoline=True``).

The graph per case: ``UNETLoader`` (tests/data/comfy_ref_flux_dev.safetensors, the tiny FLUX.1-dev of
make_comfy_ksampler_reference.py, fp32) -> ``ControlNetLoader`` (tests/data/tiny_flux_controlnet_union
.safetensors, the tiny InstantX Union file tests/controlnet_files.py builds, copied into a private
models/controlnet) -> ``SetUnionControlNetType`` -> ``ControlNetApplyAdvanced`` (image, strength, start/end
percent, VAE) on positive and negative, chained when a case applies two -> ``KSampler``. The VAE on the
apply node is tests/data/controlnet_hint_vae.py's stand-in (ComfyUI's Flux VAE is full size). The same
detection overrides as the KSampler reference let ComfyUI's detection read the tiny widths (it hard-codes
FLUX.1's). Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_reference_models import detection_overrides, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from controlnet_hint_vae import HintVAE, hint_image  # noqa: E402

COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md
MODEL_FILE = "comfy_ref_flux_dev.safetensors"
KINDS = {  # kind -> (ControlNet file, reference JSON)
    "union": ("tiny_flux_controlnet_union.safetensors", "comfy_controlnet_reference.json"),
    "xlabs": ("tiny_flux_controlnet_xlabs.safetensors", "comfy_controlnet_xlabs_reference.json"),
    "mistoline": ("tiny_flux_controlnet_mistoline.safetensors", "comfy_controlnet_mistoline_reference.json"),
}
HINTS = {"edges": (1, 36, 60), "depth": (2, 40, 40)}  # name -> (seed, height, width): other sizes than the latent's

# name, what, positive tokens, negative tokens, cfg, steps, [(hint, union type, strength, start, end)]
CASES = (
    (
        "union_canny",
        "Union canny 0.8, cfg 2, texts of 5 and 3 tokens (branches run apart)",
        5,
        3,
        2.0,
        4,
        [("edges", "canny/lineart/anime_lineart/mlsd", 0.8, 0.0, 1.0)],
    ),
    (
        "union_depth_batched",
        "Union depth 1.0, cfg 2, both texts 4 tokens (one batch, one ControlNet call)",
        4,
        4,
        2.0,
        4,
        [("depth", "depth", 1.0, 0.0, 1.0)],
    ),
    (
        "chained",
        "depth 0.7 over 0..0.6, then the same file without a type 0.5 over 0.3..1",
        5,
        3,
        1.5,
        5,
        [("depth", "depth", 0.7, 0.0, 0.6), ("edges", "auto", 0.5, 0.3, 1.0)],
    ),
    (
        "union_cfg1",
        "Union canny 1.2, cfg 1 (the negative never runs)",
        5,
        3,
        1.0,
        3,
        [("edges", "canny/lineart/anime_lineart/mlsd", 1.2, 0.0, 1.0)],
    ),
)
XLABS_CASES = (
    (
        "xlabs_canny",
        "XLabs 0.8, cfg 2, texts of 5 and 3 tokens (branches run apart)",
        5,
        3,
        2.0,
        4,
        [("edges", "auto", 0.8, 0.0, 1.0)],
    ),
    (
        "xlabs_chained",
        "XLabs depth 0.6 over 0..0.5, then edges 0.9 over 0.2..1, cfg 1.5, both texts 4 tokens (one batch)",
        4,
        4,
        1.5,
        5,
        [("depth", "auto", 0.6, 0.0, 0.5), ("edges", "auto", 0.9, 0.2, 1.0)],
    ),
)
MISTOLINE_CASES = (
    (
        "mistoline_canny",
        "Mistoline 0.8, cfg 2, texts of 5 and 3 tokens (branches run apart)",
        5,
        3,
        2.0,
        4,
        [("edges", "auto", 0.8, 0.0, 1.0)],
    ),
    (
        "mistoline_chained",
        "Mistoline depth 0.6 over 0..0.5, then edges 0.9 over 0.2..1, cfg 1.5, both texts 4 tokens (one batch)",
        4,
        4,
        1.5,
        5,
        [("depth", "auto", 0.6, 0.0, 0.5), ("edges", "auto", 0.9, 0.2, 1.0)],
    ),
)
LATENT = (48, 32)  # EmptyLatentImage width, height -> a [1, 16, 4, 6] latent


def text(name: str, tokens: int) -> list:
    return [[randn(f"cond/{name}", (1, tokens, 32)), {"pooled_output": randn(f"pooled/{name}", (1, 24))}]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--kind", choices=sorted(KINDS), default="union")
    args = parser.parse_args()
    controlnet_file, json_name = KINDS[args.kind]
    cases = {"xlabs": XLABS_CASES, "mistoline": MISTOLINE_CASES}.get(args.kind, CASES)
    torch.set_num_threads(1)
    tensors: dict[str, torch.Tensor] = {}
    records = []
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base:
        (Path(base) / "models" / "controlnet").mkdir(parents=True)
        shutil.copy(HERE / controlnet_file, Path(base) / "models" / "controlnet" / controlnet_file)
        c = import_comfy(args.comfy.resolve(), Path(base))
        overrides = detection_overrides(c)
        import comfy_extras.nodes_controlnet as nodes_controlnet

        model = c.comfy.sd.load_diffusion_model(str(HERE / MODEL_FILE), model_options={"dtype": torch.float32})
        (controlnet,) = c.nodes.ControlNetLoader().load_controlnet(controlnet_file)
        control_dtype = str(controlnet.control_model.dtype)
        net = controlnet.control_model
        control_model = f"{type(net).__name__}(latent_input={net.latent_input}, double={len(net.double_blocks)})"
        if args.kind == "mistoline":
            control_model = f"{control_model[:-1]}, single={len(net.single_blocks)}, mistoline={net.mistoline})"
        images = {name: hint_image(*spec) for name, spec in HINTS.items()}
        for name, image in images.items():
            tensors[f"hint.{name}"] = image
        for name, what, pos_tokens, neg_tokens, cfg, steps, applies in cases:
            positive, negative = text(f"{name}/pos", pos_tokens), text(f"{name}/neg", neg_tokens)
            tensors[f"{name}.pos"], tensors[f"{name}.pos_pooled"] = positive[0][0], positive[0][1]["pooled_output"]
            tensors[f"{name}.neg"], tensors[f"{name}.neg_pooled"] = negative[0][0], negative[0][1]["pooled_output"]
            vae = HintVAE()
            for hint, union_type, strength, start, end in applies:
                (typed,) = nodes_controlnet.SetUnionControlNetType().set_controlnet_type(controlnet, union_type)
                positive, negative = c.nodes.ControlNetApplyAdvanced().apply_controlnet(
                    positive, negative, typed, images[hint], strength, start, end, vae=vae
                )
            (latent,) = c.nodes.EmptyLatentImage().generate(*LATENT, 1)
            with torch.no_grad():
                (out,) = c.nodes.KSampler().sample(
                    model, 7, steps, cfg, "euler", "simple", positive, negative, latent, denoise=1.0
                )
            tensors[f"{name}.expected"] = out["samples"]
            records.append(
                {
                    "name": name,
                    "what": what,
                    "cfg": cfg,
                    "steps": steps,
                    "seed": 7,
                    "sampler_name": "euler",
                    "scheduler": "simple",
                    "latent": list(LATENT),
                    "applies": [
                        dict(zip(("hint", "type", "strength", "start_percent", "end_percent"), a)) for a in applies
                    ],
                    "vae_encode_calls": vae.calls,
                }
            )
            print(f"{name:24s} ok {tuple(out['samples'].shape)} vae calls {vae.calls}")
    reference = {
        "generator": "tests/data/make_comfy_controlnet_reference.py",
        "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT},
        "torch": torch.__version__,
        "model_file": MODEL_FILE,
        "controlnet_file": controlnet_file,
        "controlnet_dtype": control_dtype,
        "controlnet_model": control_model,
        "detection_overrides": overrides,
        "cases": records,
        "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
    }
    out_path = HERE / json_name
    out_path.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
