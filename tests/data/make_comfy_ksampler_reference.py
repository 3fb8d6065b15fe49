"""Regenerate tests/data/comfy_ksampler_reference.json by running ComfyUI's OWN KSampler on tiny models.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + ComfyUI's requirements):

    PYTHONDONTWRITEBYTECODE=1 /work/comfy-venv/bin/python tests/data/make_comfy_ksampler_reference.py \
        --comfy /work/shared/ComfyUI

It writes, next to itself (never into ComfyUI's folder):
- ``comfy_ref_<model>.safetensors``: tiny deterministic transformers in their ORIGINAL layout (Black Forest
  Labs' Flux dev / schnell, Stability's MMDiT for SD3, PixArt's own names for PixArt-Sigma), fp16 storage;
- ``comfy_ksampler_reference.json``: for every case the inputs (CONDITIONING entries with their options,
  the LATENT with its batch_index, seed, steps, cfg, sampler, scheduler, denoise, the ModelSampling* node
  and its inputs) and what ComfyUI's KSampler returned (or the error it raised).

Every model is loaded through ComfyUI's real loading path (``comfy.sd.load_diffusion_model``, what
UNETLoader calls; CPU, fp32) and sampled with ComfyUI's real nodes (``KSampler``, ``ModelSamplingFlux`` /
``SD3`` / ``AuraFlow``, ``FluxGuidance``, ``ConditioningCombine``, ``ConditioningSetTimestepRange``,
``ConditioningSetAreaStrength``, ``EmptyLatentImage``, ``LatentFromBatch``, ``LatentUpscaleBy``).

One deviation from a stock load, recorded in the JSON as ``detection_overrides``: ComfyUI's model
detection hard-codes the published widths of Flux (hidden 3072, 24 heads, T5 width 4096, rope axes
16/56/56) and PixArt (hidden 1152, 16 heads, T5 width 4096) instead of reading them from the weights, so
a tiny file would not load. For those two families the script wraps
``comfy.model_detection.detect_unet_config`` and replaces exactly those numbers with the ones the weights
show (hidden from ``img_in`` / ``x_embedder``, head width from Flux's q-norm scale / PixArt's published
72, text width from ``txt_in`` / ``y_embedder.y_proj.fc1``).
SD3 needs none: MMDiT's width is 64 x depth, read from the weights.

Nothing from this repository is imported: every number comes from ComfyUI's code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_reference_models import (  # noqa: E402 (the sibling helper, found through this folder)
    FLUX,
    PIXART,
    SD3,
    describe_model,
    detection_overrides,
    flux_state,
    import_comfy,
    pixart_state,
    randn,
    save_and_load,
    sd3_state,
)
from comfy_setup import tensor_json  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # /work/shared/COMFYUI.md (the snapshot has no .git)
JSON_NAME = "comfy_ksampler_reference.json"


# -- the cases ------------------------------------------------------------------------------------------------
class Builder:
    """Makes CONDITIONING / LATENT with ComfyUI's nodes and records what went in."""

    def __init__(self, c: SimpleNamespace):
        self.c, self.tensors = c, {}

    def tensor(self, name: str, t: torch.Tensor) -> str:
        if name in self.tensors and not torch.equal(self.tensors[name], t):
            raise SystemExit(f"tensor name {name} reused for different values")
        self.tensors[name] = t.detach().clone().float()
        return name

    def text(self, name: str, tokens: int, width: int, pooled: int | None) -> list:
        """One CLIPTextEncode-like CONDITIONING entry (embeddings + pooled_output)."""
        emb = randn(f"cond/{name}", (1, tokens, width))
        self.tensor(f"{name}.embeds", emb)
        options = {}
        if pooled is not None:
            options["pooled_output"] = randn(f"pooled/{name}", (1, pooled))
            self.tensor(f"{name}.pooled", options["pooled_output"])
        return [[emb, options, name]]  # the name is stripped before sampling (see strip)

    @staticmethod
    def strip(cond: list) -> list:
        return [[e[0], e[1]] for e in cond]

    def record(self, cond: list) -> list[dict]:
        out = []
        for _, options, name in cond:
            entry = {"embeds": f"{name}.embeds"}
            if "pooled_output" in options:
                entry["pooled"] = f"{name}.pooled"
            for key in ("guidance", "start_percent", "end_percent", "strength"):
                if key in options:
                    entry[key] = options[key]
            out.append(entry)
        return out

    # ComfyUI nodes on the named entries (names kept beside the entries)
    def guidance(self, cond: list, value: float) -> list:
        (out,) = self.c.nodes_flux.FluxGuidance.execute(self.strip(cond), value).result
        return [[o[0], o[1], e[2]] for o, e in zip(out, cond)]

    def timestep_range(self, cond: list, start: float, end: float) -> list:
        (out,) = self.c.nodes.ConditioningSetTimestepRange().set_range(self.strip(cond), start, end)
        return [[o[0], o[1], e[2]] for o, e in zip(out, cond)]

    def strength(self, cond: list, value: float) -> list:
        (out,) = self.c.nodes.ConditioningSetAreaStrength().append(self.strip(cond), value)
        return [[o[0], o[1], e[2]] for o, e in zip(out, cond)]

    def combine(self, a: list, b: list) -> list:
        (out,) = self.c.nodes.ConditioningCombine().combine(self.strip(a), self.strip(b))
        return [[o[0], o[1], e[2]] for o, e in zip(out, a + b)]

    def empty_latent(self, width: int, height: int, batch: int = 1) -> dict:
        (latent,) = self.c.nodes.EmptyLatentImage().generate(width, height, batch)
        return latent

    def image_latent(self, name: str, channels: int, h: int, w: int, batch: int = 1) -> dict:
        return {"samples": randn(f"latent/{name}", (batch, channels, h, w))}


def run_case(c, b: Builder, models: dict, case: dict) -> dict:
    """Run one case through ComfyUI's nodes and return its JSON record."""
    model = models[case["model"]]
    node = case.get("model_sampling")
    if node is not None:
        if node["node"] == "ModelSamplingFlux":
            i = node["inputs"]
            (model,) = c.nma.ModelSamplingFlux().patch(model, i["max_shift"], i["base_shift"], i["width"], i["height"])
        elif node["node"] == "ModelSamplingSD3":
            (model,) = c.nma.ModelSamplingSD3().patch(model, node["inputs"]["shift"])
        elif node["node"] == "ModelSamplingAuraFlow":
            (model,) = c.nma.ModelSamplingAuraFlow().patch_aura(model, node["inputs"]["shift"])
        else:
            raise SystemExit(f"unknown model sampling node {node['node']}")
    ms = model.get_model_object("model_sampling")
    in_force = {
        "class": type(ms).__bases__[0].__name__,
        **{a: float(getattr(ms, a)) for a in ("shift", "multiplier") if hasattr(ms, a)},
    }
    latent = case["latent"]
    positive, negative = case["positive"], case["negative"]
    record = {
        "name": case["name"],
        "what": case["what"],
        "model": case["model"],
        "model_sampling": node,
        "model_sampling_in_force": in_force,
        "positive": b.record(positive),
        "negative": b.record(negative),
        "latent": {
            "samples": b.tensor(f"{case['name']}.latent_in", latent["samples"]),
            **({"batch_index": list(latent["batch_index"])} if "batch_index" in latent else {}),
        },
        "seed": case["seed"],
        "steps": case["steps"],
        "cfg": case["cfg"],
        "sampler_name": case["sampler_name"],
        "scheduler": case["scheduler"],
        "denoise": case["denoise"],
    }
    sampler = c.comfy.samplers.KSampler(
        model,
        steps=case["steps"],
        device="cpu",
        sampler=case["sampler_name"],
        scheduler=case["scheduler"],
        denoise=case["denoise"],
    )
    record["sigmas"] = [float(f"{v:.9g}") for v in sampler.sigmas.tolist()]
    try:
        with torch.no_grad():
            (out,) = c.nodes.KSampler().sample(
                model,
                case["seed"],
                case["steps"],
                case["cfg"],
                case["sampler_name"],
                case["scheduler"],
                b.strip(positive),
                b.strip(negative),
                {k: v for k, v in latent.items()},
                denoise=case["denoise"],
            )
    except Exception as exc:  # a case ComfyUI itself refuses (e.g. beyond SD3's position table)
        record["comfy_error"] = f"{type(exc).__name__}: {exc}"
        return record
    record["expected"] = {
        "samples": b.tensor(f"{case['name']}.expected", out["samples"]),
        **({"batch_index": list(out["batch_index"])} if "batch_index" in out else {}),
    }
    return record


def maker(base: dict):
    """``mk(name, what, positive, negative, latent, **changes)`` -> one case on top of ``base``."""

    def mk(name: str, what: str, positive: list, negative: list, latent: dict, **changes) -> dict:
        case = {**base, "name": name, "what": what, "positive": positive, "negative": negative, "latent": latent}
        return {**case, "denoise": 1.0, **changes}

    return mk


def flux_sampling(max_shift: float, base_shift: float, width: int, height: int) -> dict:
    inputs = {"max_shift": max_shift, "base_shift": base_shift, "width": width, "height": height}
    return {"node": "ModelSamplingFlux", "inputs": inputs}


def flux_cases(c, b: Builder) -> list[dict]:
    ctx, vec = FLUX["context"], FLUX["vec"]
    pos, pos_b, pos_c = (b.text(n, t, ctx, vec) for n, t in (("flux_pos", 5), ("flux_pos_b", 5), ("flux_pos_c", 3)))
    neg, neg5 = b.text("flux_neg", 3, ctx, vec), b.text("flux_neg5", 5, ctx, vec)
    empty = b.empty_latent(48, 32)  # 4-channel zeros, 4x6 latent; KSampler widens it to 16 channels
    image = b.image_latent("flux_image", 16, 4, 6)
    (batch,) = c.nodes.LatentFromBatch().frombatch(b.empty_latent(48, 32, 4), 1, 2)
    (upscaled,) = c.nodes.LatentUpscaleBy().upscale(image, "nearest-exact", 1.1)
    combined = b.combine(pos, b.strength(b.guidance(pos_c, 2.0), 0.5))
    ranged = b.combine(b.timestep_range(pos, 0.0, 0.5), b.timestep_range(pos_b, 0.5, 1.0))
    neg_ranged = b.timestep_range(neg, 0.3, 1.0)
    mk = maker({"model": "flux-dev", "seed": 7, "steps": 4, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple"})
    # fmt: off
    dev = [
        mk("flux_dev_default_euler", "UNETLoader -> KSampler: the file's shift 1.15", pos, neg, empty),
        mk("flux_dev_default_dpmpp_2m", "dpmpp_2m, karras", pos, neg, empty, sampler_name="dpmpp_2m", scheduler="karras"),
        mk("flux_dev_default_euler_ancestral", "seeded step noise", pos, neg, empty, sampler_name="euler_ancestral", seed=9),
        mk("flux_dev_model_sampling_flux", "ModelSamplingFlux 1.3/0.3 at 1024x768", pos, neg, empty,
           model_sampling=flux_sampling(1.3, 0.3, 1024, 768)),
        mk("flux_dev_model_sampling_flux_image_size", "ModelSamplingFlux at 48x32", pos, neg, empty,
           model_sampling=flux_sampling(1.15, 0.5, 48, 32)),
        mk("flux_dev_guidance_per_branch", "FluxGuidance 4.0 positive, 1.5 negative", b.guidance(pos, 4.0),
           b.guidance(neg5, 1.5), empty, cfg=2.5),
        mk("flux_dev_guidance_negative_default", "FluxGuidance 5.0 on positive only: negative 3.5",
           b.guidance(pos, 5.0), neg5, empty, cfg=2.5),
        mk("flux_dev_zero_latent_denoise", "all-zero latent, denoise 0.6: not shifted", pos, neg, empty, denoise=0.6),
        mk("flux_dev_image_denoise", "non-zero latent, denoise 0.6", pos, neg, image, denoise=0.6),
        mk("flux_dev_batch_index", "LatentFromBatch(1, 2) of 4: noise draws 1, 2", pos, neg, batch),
        mk("flux_dev_token_counts", "positive 5 tokens, negative 3, cfg 3", pos, neg, empty, cfg=3.0),
        mk("flux_dev_combine", "Combine(A, AreaStrength(B 3 tokens, 0.5))", combined, neg, empty, cfg=2.0),
        mk("flux_dev_timestep_range", "A 0..0.5 + B 0.5..1; negative 0.3..1", ranged, neg_ranged, empty, cfg=2.0, steps=5),
        mk("flux_dev_odd_size", "72x56 px: padded and cropped", pos, neg, b.empty_latent(72, 56), cfg=2.0),
        mk("flux_dev_upscale_by_1_1", "LatentUpscaleBy 1.1 (4x6 -> 4x7)", pos, neg, upscaled, denoise=0.5),
        mk("flux_dev_denoise_zero", "denoise 0.0 returns the input", pos, neg, image, denoise=0.0),
    ]
    # fmt: on
    mk = maker(
        {"model": "flux-schnell", "seed": 11, "steps": 3, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple"}
    )
    # fmt: off
    schnell = [
        mk("flux_schnell_default_euler", "schnell's own sampling: shift 1.0, multiplier 1.0", pos, neg, empty),
        mk("flux_schnell_image_denoise", "non-zero latent, denoise 0.5", pos, neg, image, denoise=0.5),
        mk("flux_schnell_model_sampling_flux", "ModelSamplingFlux at 512x512", pos, neg, empty,
           model_sampling=flux_sampling(1.15, 0.5, 512, 512)),
    ]
    # fmt: on
    return dev + schnell


def sd3_cases(c, b: Builder) -> list[dict]:
    ctx, adm = SD3["context"], SD3["adm"]
    pos, neg, neg5 = (b.text(n, t, ctx, adm) for n, t in (("sd3_pos", 5), ("sd3_neg", 3), ("sd3_neg5", 5)))
    empty = b.empty_latent(48, 32)
    image = b.image_latent("sd3_image", 16, 4, 6)
    n = SD3["pos_embed_max_size"]
    too_big = b.empty_latent(16 * (n + 1), 16 * (n + 1))  # n+1 tokens per side
    sd3_shift = {"node": "ModelSamplingSD3", "inputs": {"shift": 5.0}}
    aura_shift = {"node": "ModelSamplingAuraFlow", "inputs": {"shift": 1.73}}
    mk = maker({"model": "sd3", "seed": 5, "steps": 4, "cfg": 4.0, "sampler_name": "euler", "scheduler": "simple"})
    # fmt: off
    return [
        mk("sd3_default_euler", "SD3's own sampling: discrete flow, shift 3.0", pos, neg5, empty),
        mk("sd3_default_dpmpp_2m", "dpmpp_2m, sgm_uniform", pos, neg5, empty, sampler_name="dpmpp_2m", scheduler="sgm_uniform"),
        mk("sd3_model_sampling_sd3", "ModelSamplingSD3(5.0)", pos, neg5, empty, model_sampling=sd3_shift),
        mk("sd3_model_sampling_auraflow", "ModelSamplingAuraFlow(1.73)", pos, neg5, empty, model_sampling=aura_shift),
        mk("sd3_token_counts", "positive 5 tokens, negative 3", pos, neg, empty),
        mk("sd3_zero_latent_denoise", "all-zero latent, denoise 0.6: not shifted", pos, neg5, empty, denoise=0.6),
        mk("sd3_image_denoise", "non-zero latent, denoise 0.6", pos, neg5, image, denoise=0.6),
        mk("sd3_odd_size", "72x56 px: padded and cropped", pos, neg, b.empty_latent(72, 56)),
        mk("sd3_beyond_pos_embed", f"{n + 1} tokens a side > pos_embed_max_size {n}", pos, neg5, too_big, steps=1),
    ]
    # fmt: on


def pixart_cases(c, b: Builder) -> list[dict]:
    pos, neg = b.text("pixart_pos", 6, PIXART["caption"], None), b.text("pixart_neg", 4, PIXART["caption"], None)
    # latent 4x62: ComfyUI's PixArt derives its position-embedding base size from the resolution
    # (c_res = (4+62)//2 = 33, round(33/64)*64 // 2 = 32 = the file's 64 // 2), where diffusers fixes it
    # from the config; below c_res 33 ComfyUI's base size is 0 (a constant position embedding)
    empty = b.empty_latent(496, 32)
    image = b.image_latent("pixart_image", 4, 4, 62)
    mk = maker(
        {"model": "pixart-sigma", "seed": 3, "steps": 3, "cfg": 4.5, "sampler_name": "euler", "scheduler": "simple"}
    )
    # fmt: off
    return [
        mk("pixart_default_euler", "discrete eps, sqrt_linear betas; 6 vs 4 tokens", pos, neg, empty),
        mk("pixart_default_dpmpp_2m", "dpmpp_2m, normal", pos, neg, empty, sampler_name="dpmpp_2m", scheduler="normal"),
        mk("pixart_image_denoise", "non-zero latent (Sigma: SDXL format), denoise 0.6", pos, neg, image, denoise=0.6),
        mk("pixart_odd_size", "488x40 px: not a multiple of the patch", pos, neg, b.empty_latent(488, 40), steps=1),
    ]
    # fmt: on


CONVENTIONS = {
    # what ComfyUI 0.3.64 does, with file:line in the snapshot; the cases above exercise each
    "model_sampling_defaults": (
        "model_base.py:77 model_sampling(): ModelType FLUX -> ModelSamplingFlux+CONST, FLOW -> "
        "ModelSamplingDiscreteFlow+CONST, EPS -> ModelSamplingDiscrete+EPS; settings from "
        "supported_models.py sampling_settings: Flux (:692, dev, guidance_in present) {} -> shift 1.15 "
        "(model_sampling.py:351); FluxSchnell (:729, no guidance_in) multiplier 1.0, shift 1.0, ModelType FLOW "
        "(:741); SD3 (:529) shift 3.0, multiplier 1000 default (model_sampling.py:257); PixArtAlpha (:619) "
        "sqrt_linear 0.0001..0.02, 1000 steps; PixArtSigma (:646) same, SDXL latent format (alpha: SD15). "
        "Detection: model_detection.py:174-220 (flux guidance_embed from guidance_in), :40-64 (mmdit: depth = "
        "width/64, pos_embed_max_size = sqrt(pos_embed rows)), :290-313 (pixart sigma vs alpha by ar_embedder, "
        "input_size and pe_interpolation from pos_embed)"
    ),
    "model_sampling_nodes": (
        "comfy_extras/nodes_model_advanced.py:114 ModelSamplingSD3(shift=3.0) -> DiscreteFlow(shift, multiplier "
        "1000); :140 ModelSamplingAuraFlow(shift=1.73) -> DiscreteFlow(shift, multiplier 1.0); :152 "
        "ModelSamplingFlux(max_shift=1.15, base_shift=0.5, width=1024, height=1024) -> Flux shift "
        "width*height/256 * (max-base)/3840 + base - 256*(max-base)/3840 (:174); any node on any model"
    ),
    "guidance": (
        "model_base.py:895 Flux.extra_conds: guidance = that entry's options.get('guidance', 3.5), per "
        "conditioning entry (so per branch); FluxGuidance (comfy_extras/nodes_flux.py:34) sets it on every entry"
    ),
    "empty_latent": (
        "samplers.py:973 CFGGuider.inner_sample: process_latent_in only if count_nonzero(latent) > 0 (whole "
        "batch); process_latent_out always; sample.py fix_empty_latent_channels widens an all-zero latent"
    ),
    "batch_index": (
        "nodes.py:1483 common_ksampler passes latent['batch_index'] to sample.py:8 prepare_noise: one CPU "
        "generator seeded with seed, draws [1,C,H,W] for 0..max(index), item i gets draw batch_index[i]; "
        "nodes.py:1495 the output LATENT is a copy of the input dict (batch_index kept)"
    ),
    "denoise": (
        "samplers.py:1129 set_steps: denoise > 0.9999 -> full schedule; <= 0 -> empty sigmas and "
        "samplers.py:1014 returns the input latent unchanged; else int(steps/denoise) steps, last steps+1 sigmas"
    ),
    "several_entries": (
        "samplers.py:_calc_cond_batch: every entry of a branch runs; out = sum(pred*mult)/sum(mult) with "
        "mult = strength (samplers.py:49) and counts starting at 1e-37 (:226, :352): a branch with no active "
        "entry predicts 0; timestep range: calculate_start_end_timesteps (:627) turns start/end_percent into "
        "sigmas with model_sampling.percent_to_sigma, an entry is skipped when sigma > start or sigma < end (:35)"
    ),
    "token_counts": (
        "Flux/SD3/PixArt wrap the text as CONDRegular (model_base.py:742, :824, :883), which concatenates only "
        "equal shapes (conds.py:17): positive and negative with different token counts run as separate model "
        "calls, never repeated to a common length (that is CONDCrossAttn, conds.py:46, for UNet models)"
    ),
    "cfg1": "samplers.py:378: cfg == 1 (isclose) skips the negative entirely",
    "padding": (
        "Flux: flux/model.py:216 pad_to_patch_size (common_dit.py:5, circular) and crop :280; SD3: mmdit.py "
        "PatchEmbed dynamic_img_pad (circular), cropped_pos_embed rounds up, output cropped; PixArt: pads in "
        "PatchEmbed but builds its position embedding for H//2 x W//2 tokens, so odd sizes fail (case pixart_odd_size)"
    ),
    "pos_embed_max_size": "mmdit.py:898 asserts patched height/width <= pos_embed_max_size (case sd3_beyond_pos_embed)",
}


def node_inputs(c) -> dict:
    """The ModelSampling* nodes' inputs besides the model (the parallel nodes take the same)."""
    out = {}
    for name in ("ModelSamplingFlux", "ModelSamplingSD3", "ModelSamplingAuraFlow"):
        required = getattr(c.nma, name).INPUT_TYPES()["required"]
        out[name] = {k: [v[0], dict(v[1]) if len(v) > 1 else {}] for k, v in required.items() if k != "model"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)  # reduction order independent of the machine's cores
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        overrides = detection_overrides(c)
        b = Builder(c)
        states = {
            "flux-dev": flux_state(c, guidance=True),
            "flux-schnell": flux_state(c, guidance=False),
            "sd3": sd3_state(c),
            "pixart-sigma": pixart_state(c),
        }
        models, model_info = {}, {}
        for name, state in states.items():
            path, model = save_and_load(c, name.replace("-", "_"), state, args.out)
            models[name] = model
            family = {"flux-dev": "flux", "flux-schnell": "flux", "sd3": "mmdit", "pixart-sigma": "pixart_sigma"}[name]
            model_info[name] = {
                "file": path.name,
                "bytes": path.stat().st_size,
                "storage_dtype": "float16",
                "structure": {
                    "flux-dev": FLUX,
                    "flux-schnell": FLUX,
                    "sd3": {**SD3, "hidden": 64 * SD3["depth"]},
                    "pixart-sigma": PIXART,
                }[name],
                "detection_overrides": overrides.get(
                    {"flux": "flux", "mmdit": None, "pixart_sigma": "pixart_sigma"}[family], {}
                ),
                "comfy": describe_model(model),
            }
        cases = flux_cases(c, b) + sd3_cases(c, b) + pixart_cases(c, b)
        records = [run_case(c, b, models, case) for case in cases]
        import comfy.model_management as mm

        reference = {
            "generator": "tests/data/make_comfy_ksampler_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "compute": {"device": str(mm.get_torch_device()), "dtype": "float32", "threads": torch.get_num_threads()},
            "conventions": CONVENTIONS,
            "node_inputs": node_inputs(c),
            "models": model_info,
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
        print(f"{r['name']:45s} {r['model_sampling_in_force']} {status}")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
