"""Regenerate tests/data/comfy_kontext_reference.json with ComfyUI's OWN nodes and KSampler (FLUX.1 Kontext).

Run by hand (not in CI) with the Python that imports ComfyUI (tests/comfyui/comfy_env.py builds one):

    PYTHONDONTWRITEBYTECODE=1 <comfy venv>/bin/python tests/data/make_comfy_kontext_reference.py \
        --comfy /work/shared/ComfyUI

FLUX.1 Kontext [dev] has exactly FLUX.1 dev's tensors (Black Forest Labs' layout, ComfyUI detects it as Flux),
so the Kontext-structure file is make_comfy_ksampler_reference.py's tiny Flux dev, ``comfy_ref_flux_dev.safetensors``
(checked here to equal comfy_reference_models.flux_state), loaded with ``comfy.sd.load_diffusion_model`` (what
UNETLoader calls). Reference images are raw VAE-space latents (as VAEEncode gives them) chained onto the
conditioning with ComfyUI's ``ReferenceLatent``; ``FluxKontextMultiReferenceLatentMethod`` picks the placement,
``FluxGuidance`` the guidance; ``KSampler`` samples. The reference latents have odd sizes, so their padding to
whole patches and the rounding of their offsets count. The detection override of make_comfy_ksampler_reference.py
applies. Nothing from this repository's engine is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_reference_models import FLUX, detection_overrides, flux_state, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md (the snapshot has no .git)
FILE_NAME = "comfy_ref_flux_dev.safetensors"
JSON_NAME = "comfy_kontext_reference.json"
REFERENCES = {"ref1": (5, 5), "ref2": (6, 4)}  # latent pixels (height, width)


def text(name: str, tokens: int) -> list:
    emb = randn(f"kontext/cond/{name}", (1, tokens, FLUX["context"]))
    pooled = randn(f"kontext/pooled/{name}", (1, FLUX["vec"]))
    return [[emb, {"pooled_output": pooled}]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        overrides = detection_overrides(c)
        import comfy_extras.nodes_edit_model as edit_nodes
        from safetensors.torch import load_file

        path = HERE / FILE_NAME
        stored, built = load_file(str(path)), flux_state(c, guidance=True)
        assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built), "file moved"
        model = c.comfy.sd.load_diffusion_model(str(path))

        def reference(cond: list, name: str) -> list:
            latent = {"samples": randn(f"kontext/latent/{name}", (1, 16, *REFERENCES[name]))}
            return edit_nodes.ReferenceLatent.execute(cond, latent).result[0]

        def guidance(cond: list, value: float) -> list:
            return c.nodes_flux.FluxGuidance.execute(cond, value).result[0]

        def method(cond: list, value: str) -> list:
            return c.nodes_flux.FluxKontextMultiReferenceLatentMethod.execute(cond, value).result[0]

        tensors: dict[str, torch.Tensor] = {}
        texts = {"pos": text("pos", 5), "neg": text("neg", 3)}
        for name, cond in texts.items():
            tensors[f"{name}.embeds"], tensors[f"{name}.pooled"] = cond[0][0], cond[0][1]["pooled_output"]
        for name, size in REFERENCES.items():
            tensors[f"{name}.latent"] = randn(f"kontext/latent/{name}", (1, 16, *size))
        pos, neg = texts["pos"], texts["neg"]
        both = reference(reference(pos, "ref1"), "ref2")
        conds = {
            "one_reference": (reference(guidance(pos, 2.5), "ref1"), neg),
            "two_references_offset": (guidance(both, 2.5), reference(reference(neg, "ref1"), "ref2")),
            "two_references_index": (method(guidance(both, 4.0), "index"), neg),
        }
        base = {"seed": 11, "steps": 3, "denoise": 1.0, "width": 48, "height": 32, "scheduler": "simple"}
        cases = [
            {**base, "name": "one_reference", "cfg": 1.0, "sampler_name": "euler"},
            {**base, "name": "two_references_offset", "cfg": 2.0, "sampler_name": "euler"},
            {**base, "name": "two_references_index", "cfg": 2.0, "sampler_name": "dpmpp_2m"},
        ]
        records = []
        for case in cases:
            positive, negative = conds[case["name"]]
            (latent,) = c.nodes.EmptyLatentImage().generate(case["width"], case["height"], 1)
            with torch.no_grad():
                (out,) = c.nodes.KSampler().sample(
                    model,
                    case["seed"],
                    case["steps"],
                    case["cfg"],
                    case["sampler_name"],
                    case["scheduler"],
                    positive,
                    negative,
                    latent,
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
        reference_json = {
            "generator": "tests/data/make_comfy_kontext_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT},
            "torch": torch.__version__,
            "file": FILE_NAME,
            "structure": FLUX,
            "detection_overrides": overrides.get("flux", {}),
            "cases": records,
            "tensors": {k: tensor_json(v) for k, v in sorted(tensors.items())},
        }
    out_path = args.out / JSON_NAME
    out_path.write_text(json.dumps(reference_json, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out_path}")


def describe(cond: list, name: str) -> dict:
    """The one entry's options as the test rebuilds them (tensors by name)."""
    ((embeds, options),) = cond
    refs = options.get("reference_latents") or []
    entry = {"embeds": f"{name}.embeds", "pooled": f"{name}.pooled"}
    if "guidance" in options:
        entry["guidance"] = options["guidance"]
    if refs:
        names = []
        for ref in refs:
            names.append(next(f"{k}.latent" for k, s in REFERENCES.items() if tuple(ref.shape[-2:]) == s))
        entry["reference_latents"] = names
    if "reference_latents_method" in options:
        entry["reference_latents_method"] = options["reference_latents_method"]
    return entry


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
