"""Regenerate tests/data/comfy_easycache_reference.json by running ComfyUI's OWN EasyCache / LazyCache nodes
with its KSampler on the tiny Flux files of make_comfy_ksampler_reference.py.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + ComfyUI's requirements), e.g. the venv
tests/comfyui/ builds:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_easycache_reference.py --comfy /work/shared/ComfyUI

It reads ``comfy_ref_flux_dev.safetensors`` / ``comfy_ref_flux_schnell.safetensors`` (written by
make_comfy_ksampler_reference.py; loaded through ComfyUI's real ``comfy.sd.load_diffusion_model`` with the
same detection overrides) and writes ``comfy_easycache_reference.json``: for every case the inputs (the cache
node and its inputs, CONDITIONING, LATENT, seed, steps, cfg, sampler, scheduler), which guided evaluations
the cache skipped (counted by wrapping ComfyUI's ``KSamplerX0Inpaint.__call__`` and its holders' ``apply_cache_diff``
at run time; nothing in ComfyUI's files changes) and what KSampler returned.

Nothing from this repository is imported: every number comes from ComfyUI's code.
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
from comfy_reference_models import FLUX, detection_overrides, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md (the snapshot has no .git)
JSON_NAME = "comfy_easycache_reference.json"
FILES = {"flux-dev": "comfy_ref_flux_dev.safetensors", "flux-schnell": "comfy_ref_flux_schnell.safetensors"}

# name, what, cache node, its inputs (reuse_threshold, start_percent, end_percent), model, cfg, sampler, steps
CASES = (
    (
        "easycache_defaults",
        "EasyCache defaults, cond + uncond batched",
        "EasyCache",
        (0.2, 0.15, 0.95),
        "flux-dev",
        2.0,
    ),
    ("easycache_cfg2", "EasyCache 0.6, cond + uncond batched", "EasyCache", (0.6, 0.15, 0.95), "flux-dev", 2.0),
    ("easycache_cfg1", "EasyCache 0.5, cfg 1 (positive only)", "EasyCache", (0.5, 0.15, 0.95), "flux-dev", 1.0),
    ("easycache_window", "EasyCache 0.3..0.8 of the sampling", "EasyCache", (0.3, 0.3, 0.8), "flux-schnell", 2.5),
    (
        "easycache_heun",
        "EasyCache, heun (two evaluations a step)",
        "EasyCache",
        (0.2, 0.15, 0.95),
        "flux-dev",
        2.0,
        "heun",
    ),
    ("lazycache_cfg2", "LazyCache defaults, cfg 2", "LazyCache", (0.2, 0.15, 0.95), "flux-dev", 2.0),
    ("lazycache_cfg1", "LazyCache, cfg 1", "LazyCache", (0.1, 0.15, 0.95), "flux-schnell", 1.0),
)
STEPS, SEED, SIZE = 20, 3, 128  # 128x128 px: a 16x16 latent, subsampled to 2x2 by the caches


class Recorder:
    """Counts guided evaluations and notes those a cache answered from its cached difference."""

    def __init__(self, c):
        import comfy.samplers
        from comfy_extras import nodes_easycache

        self.evaluations, self.skipped = 0, []
        wrapper = comfy.samplers.KSamplerX0Inpaint  # the sampler calls it once per guided evaluation
        original = wrapper.__call__

        def counted(*args, **kwargs):
            self.evaluations += 1
            return original(*args, **kwargs)

        wrapper.__call__ = counted
        for holder in (nodes_easycache.EasyCacheHolder, nodes_easycache.LazyCacheHolder):
            holder.apply_cache_diff = self._noting(holder.apply_cache_diff)

    def _noting(self, apply):
        def noted(holder, *args, **kwargs):
            if not self.skipped or self.skipped[-1] != self.evaluations:
                self.skipped.append(self.evaluations)
            return apply(holder, *args, **kwargs)

        return noted

    def start(self) -> None:
        self.evaluations, self.skipped = 0, []


def run_case(c, recorder: Recorder, models: dict, case: tuple, tensors: dict) -> dict:
    from comfy_extras import nodes_easycache

    name, what, node, (threshold, start, end), model_name, cfg = case[:6]
    sampler = case[6] if len(case) > 6 else "euler"
    ctx, vec = FLUX["context"], FLUX["vec"]
    pos = [[randn(f"cond/{name}_pos", (1, 5, ctx)), {"pooled_output": randn(f"pooled/{name}_pos", (1, vec))}]]
    neg = [[randn(f"cond/{name}_neg", (1, 5, ctx)), {"pooled_output": randn(f"pooled/{name}_neg", (1, vec))}]]
    for role, cond in (("pos", pos), ("neg", neg)):
        tensors[f"{name}.{role}.embeds"] = cond[0][0]
        tensors[f"{name}.{role}.pooled"] = cond[0][1]["pooled_output"]
    node_class = {"EasyCache": nodes_easycache.EasyCacheNode, "LazyCache": nodes_easycache.LazyCacheNode}[node]
    (model,) = node_class.execute(models[model_name], threshold, start, end, False).result
    (latent,) = c.nodes.EmptyLatentImage().generate(SIZE, SIZE, 1)
    recorder.start()
    with torch.no_grad():
        (out,) = c.nodes.KSampler().sample(model, SEED, STEPS, cfg, sampler, "simple", pos, neg, latent, denoise=1.0)
    tensors[f"{name}.expected"] = out["samples"]
    return {
        "name": name,
        "what": what,
        "node": node,
        "inputs": {"reuse_threshold": threshold, "start_percent": start, "end_percent": end, "verbose": False},
        "model": model_name,
        "positive": {"embeds": f"{name}.pos.embeds", "pooled": f"{name}.pos.pooled"},
        "negative": {"embeds": f"{name}.neg.embeds", "pooled": f"{name}.neg.pooled"},
        "latent": {"width": SIZE, "height": SIZE, "batch_size": 1, "node": "EmptyLatentImage"},
        "seed": SEED,
        "steps": STEPS,
        "cfg": cfg,
        "sampler_name": sampler,
        "scheduler": "simple",
        "evaluations": recorder.evaluations,
        "skipped_evaluations": list(recorder.skipped),
        "expected": f"{name}.expected",
    }


def node_inputs() -> dict:
    """EasyCache's and LazyCache's inputs besides the model (the parallel nodes take the same)."""
    from comfy_extras import nodes_easycache

    out = {}
    for name, node in (("EasyCache", nodes_easycache.EasyCacheNode), ("LazyCache", nodes_easycache.LazyCacheNode)):
        schema = node.define_schema()
        out[name] = {
            i.id: {k: getattr(i, k) for k in ("default", "min", "max", "step") if getattr(i, k, None) is not None}
            for i in schema.inputs
            if i.id != "model"
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)  # reduction order independent of the machine's cores
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        detection_overrides(c)
        models = {
            name: c.comfy.sd.load_diffusion_model(str(HERE / f), model_options={"dtype": torch.float32})
            for name, f in FILES.items()
        }
        recorder = Recorder(c)
        tensors: dict[str, torch.Tensor] = {}
        records = [run_case(c, recorder, models, case, tensors) for case in CASES]
        reference = {
            "generator": "tests/data/make_comfy_easycache_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "compute": {"device": "cpu", "dtype": "float32", "threads": torch.get_num_threads()},
            "models": FILES,
            "node_inputs": node_inputs(),
            "cases": records,
        }
    compact = ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(tensor_json(v), separators=(',', ':'))}" for k, v in sorted(tensors.items())
    )
    text = json.dumps(reference, indent=1)[:-2] + ',\n "tensors": {\n' + compact + "\n }\n}\n"
    json.loads(text)  # well-formed
    out = args.out / JSON_NAME
    out.write_text(text, encoding="utf-8")
    for r in records:
        print(f"{r['name']:20s} skipped {len(r['skipped_evaluations'])}/{r['evaluations']}: {r['skipped_evaluations']}")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
