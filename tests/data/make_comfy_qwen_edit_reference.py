"""Regenerate tests/data/comfy_qwen_edit_reference.json with ComfyUI's OWN nodes and KSampler (Qwen-Image-Edit).

Run by hand (not in CI) with the Python that imports ComfyUI (tests/comfyui/comfy_env.py builds one):

    PYTHONDONTWRITEBYTECODE=1 <comfy venv>/bin/python tests/data/make_comfy_qwen_edit_reference.py \
        [--comfy /work/shared/ComfyUI]

Qwen-Image-Edit and Edit-2509 ("Plus") have Qwen-Image's tensors (ComfyUI detects them as QwenImage), so the
edit-structure file is make_comfy_qwen_image_reference.py's tiny ``tiny_qwen_image_bf16.safetensors`` (checked here
to be unchanged), loaded the way that script loads it (ComfyUI's loader, the tiny widths added to detection).
TextEncodeQwenImageEditPlus puts the VAE-encoded images in the conditioning's ``reference_latents`` (appended
after the text encode); the same option is made here with ComfyUI's ``ReferenceLatent`` from raw one-frame Wan
latents [1, 16, 1, h, w] of odd sizes (two references, as the 2509 model takes several). The cases: the default
``index`` placement with CFG (the negative without references), ``offset`` (FluxKontextMultiReferenceLatentMethod)
on an odd grid without CFG, and references on both branches. ``KSampler`` samples (``nodes.common_ksampler``).
Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_setup import tensor_json  # noqa: E402
from make_comfy_qwen_image_reference import (  # noqa: E402
    FILES,
    LATENT_CHANNELS,
    NUM_LAYERS,
    TINY_WIDTHS,
    comfy_commit,
    import_comfy,
    load_with_comfy,
)

JSON_NAME = "comfy_qwen_edit_reference.json"
REFERENCES = {"ref1": (5, 7), "ref2": (6, 6)}  # latent pixels (height, width)
TEXT = {"pos": 7, "neg": 5}  # tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    comfy_dir = args.comfy.resolve()
    c = import_comfy(comfy_dir)
    import comfy_extras.nodes_edit_model as edit_nodes
    import comfy_extras.nodes_flux as flux_nodes

    path = HERE / FILES["bf16"]
    reference = json.loads((HERE / "comfy_qwen_image_reference.json").read_text(encoding="utf-8"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == reference["files"]["bf16"]["sha256"], "file moved"
    patcher = load_with_comfy(c, path)

    gen = torch.Generator().manual_seed(2509)
    tensors = {
        f"{n}.embeds": torch.randn(1, t, TINY_WIDTHS["joint_attention_dim"], generator=gen) for n, t in TEXT.items()
    }
    for name, (h, w) in REFERENCES.items():
        tensors[f"{name}.latent"] = torch.randn(1, LATENT_CHANNELS, 1, h, w, generator=gen) * 0.5

    def text(name: str) -> list:
        return [[tensors[f"{name}.embeds"], {}]]

    def refs(cond: list) -> list:
        for name in REFERENCES:
            cond = edit_nodes.ReferenceLatent.execute(cond, {"samples": tensors[f"{name}.latent"]}).result[0]
        return cond

    def offset(cond: list) -> list:
        return flux_nodes.FluxKontextMultiReferenceLatentMethod.execute(cond, "offset").result[0]

    base = {"seed": 5, "steps": 3, "denoise": 1.0, "scheduler": "simple", "sampler_name": "euler"}
    cases = [
        ({**base, "name": "two_references_index_cfg", "latent_shape": [1, 16, 8, 12], "cfg": 2.5},
         refs(text("pos")), text("neg")),
        ({**base, "name": "two_references_offset_odd_grid", "latent_shape": [1, 16, 10, 6], "cfg": 1.0,
          "sampler_name": "dpmpp_2m"}, offset(refs(text("pos"))), text("neg")),
        ({**base, "name": "references_on_both_branches", "latent_shape": [1, 16, 8, 12], "cfg": 3.0},
         refs(text("pos")), refs(text("neg"))),
    ]  # fmt: skip
    records = []
    for case, positive, negative in cases:
        with torch.no_grad():
            (out,) = c.nodes.common_ksampler(
                patcher,
                case["seed"],
                case["steps"],
                case["cfg"],
                case["sampler_name"],
                case["scheduler"],
                positive,
                negative,
                {"samples": torch.zeros(case["latent_shape"])},
                denoise=case["denoise"],
            )
        tensors[f"{case['name']}.samples"] = out["samples"]
        records.append(
            {
                **case,
                "positive": describe(positive, "pos"),
                "negative": describe(negative, "neg"),
                "samples": f"{case['name']}.samples",
            }
        )
        print(f"{case['name']}: samples {list(out['samples'].shape)} mean |x| {out['samples'].abs().mean():.4f}")
    record = {
        "generator": "tests/data/make_comfy_qwen_edit_reference.py",
        "comfyui_commit": comfy_commit(comfy_dir),
        "torch": torch.__version__,
        "file": FILES["bf16"],
        "config": {
            "num_layers": NUM_LAYERS,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in TINY_WIDTHS.items()},
        },
        "cases": records,
        "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
    }
    out_path = HERE / JSON_NAME
    out_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path}")


def describe(cond: list, name: str) -> dict:
    """The one entry's options as the test rebuilds them (tensors by name)."""
    ((_, options),) = cond
    entry: dict = {"embeds": f"{name}.embeds"}
    refs = options.get("reference_latents") or []
    if refs:
        entry["reference_latents"] = [
            next(f"{k}.latent" for k, s in REFERENCES.items() if tuple(r.shape[-2:]) == s) for r in refs
        ]
    if "reference_latents_method" in options:
        entry["reference_latents_method"] = options["reference_latents_method"]
    return entry


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
