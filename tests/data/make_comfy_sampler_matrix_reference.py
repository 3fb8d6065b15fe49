"""Regenerate tests/data/comfy_sampler_matrix_reference.json: ComfyUI 0.3.64's own KSampler node with
every sampler of its SAMPLER_NAMES on a tiny Flux-structure file and a tiny Wan file, plus SamplerCustom
graphs whose SAMPLER comes from ComfyUI's sampler nodes.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + its requirements),
e.g. the tests' ComfyUI venv (tests/comfyui/comfy_env.py builds it under ~/.cache/dit-parallel):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \\
        tests/data/make_comfy_sampler_matrix_reference.py --comfy /work/shared/ComfyUI

What runs is ComfyUI's: the Flux file is tests/data/comfy_ref_flux_dev.safetensors (written by
make_comfy_ksampler_reference.py; loaded with the same detection overrides it records), the Wan file is
``wan_tiny_weights.tiny_wan_state_dict(TinyWan(), "matrix")`` written to a temporary folder; both load with
``comfy.sd.load_diffusion_model`` (UNETLoader's path, fp32, CPU). Latents come from EmptyLatentImage /
EmptyHunyuanLatentVideo, sampling from ``nodes.KSampler`` (each sampler with one of the nine schedulers,
rotating) and ``SamplerCustom`` with BasicScheduler's SIGMAS. Flux conditioning is stored as numbers, the
4096-wide Wan text embeddings as ``hashed_uniform`` recipes with a digest. Nothing from parallel_runtime is
imported.
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
from comfy_reference_models import detection_overrides, import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest, tiny_wan_state_dict  # noqa: E402

HERE = Path(__file__).resolve().parent
COMFY_COMMIT = "a125cd84b054a57729b5eecab930ca9408719832"  # ComfyUI 0.3.64 (shared/COMFYUI.md)
JSON_NAME = "comfy_sampler_matrix_reference.json"
STEPS = 4
MODELS = {
    # flux: 32x32 px -> a 4x4 latent (2x2 tokens); wan: 32x16 px, 5 frames -> 2 latent frames of 2x4
    "flux": {"file": "comfy_ref_flux_dev.safetensors", "cfg": 2.0, "seed": 100, "offset": 0},
    "wan": {"salt": "matrix", "cfg": 3.0, "seed": 300, "offset": 4},
}
DIGITS = 8  # float32 results to 1e-8 relative: far inside the tests' 1e-4


def wan_text(name: str, tokens: int) -> tuple[torch.Tensor, dict]:
    t = hashed_uniform(name, (1, tokens, 4096), 1.0)
    return t, {"name": name, "shape": [1, tokens, 4096], "scale": 1.0, "digest": state_digest({"t": t})}


def load_models(c, folder: Path) -> tuple[dict, dict]:
    from safetensors.torch import save_file

    overrides = detection_overrides(c)
    flux = c.comfy.sd.load_diffusion_model(str(HERE / MODELS["flux"]["file"]), model_options={"dtype": torch.float32})
    state = tiny_wan_state_dict(TinyWan(), MODELS["wan"]["salt"])
    save_file(state, str(folder / "tiny_wan_matrix.safetensors"))
    wan = c.comfy.sd.load_diffusion_model(str(folder / "tiny_wan_matrix.safetensors"), {"dtype": torch.float32})
    info = {
        "flux": {"file": MODELS["flux"]["file"], "detection_overrides": overrides.get("flux", {})},
        "wan": {"config": TinyWan().__dict__, "salt": MODELS["wan"]["salt"], "digest": state_digest(state)},
    }
    return {"flux": flux, "wan": wan}, info


def inputs(c) -> tuple[dict, dict]:
    """Per model: (positive, negative) CONDITIONING and the LATENT, and their JSON records."""
    from comfy_extras.nodes_hunyuan import EmptyHunyuanLatentVideo

    flux_pos = [[randn("matrix/flux_pos", (1, 5, 32)), {"pooled_output": randn("matrix/flux_pos_pooled", (1, 24))}]]
    flux_neg = [[randn("matrix/flux_neg", (1, 3, 32)), {"pooled_output": randn("matrix/flux_neg_pooled", (1, 24))}]]
    (flux_latent,) = c.nodes.EmptyLatentImage().generate(32, 32, 1)
    (wan_pos_t, wan_pos), (wan_neg_t, wan_neg) = wan_text("matrix/wan_pos", 12), wan_text("matrix/wan_neg", 8)
    (wan_latent,) = EmptyHunyuanLatentVideo().generate(32, 16, 5, 1)
    graphs = {
        "flux": (flux_pos, flux_neg, flux_latent),
        "wan": ([[wan_pos_t, {}]], [[wan_neg_t, {}]], wan_latent),
    }
    records = {
        "flux": {
            "positive": {"embeds": tensor_json(flux_pos[0][0]), "pooled": tensor_json(flux_pos[0][1]["pooled_output"])},
            "negative": {"embeds": tensor_json(flux_neg[0][0]), "pooled": tensor_json(flux_neg[0][1]["pooled_output"])},
            "latent": tensor_json(flux_latent["samples"]),
        },
        "wan": {"positive": wan_pos, "negative": wan_neg, "latent": tensor_json(wan_latent["samples"])},
    }
    return graphs, records


def custom_samplers(c) -> list[dict]:
    """SamplerCustom graphs: (ComfyUI sampler node, its inputs, BasicScheduler's scheduler and steps)."""
    import comfy_extras.nodes_custom_sampler as ncs

    specs = [
        ("SamplerEulerAncestral", ncs.SamplerEulerAncestral, {"eta": 0.5, "s_noise": 0.8}, "karras", 5),
        (
            "SamplerDPMPP_2M_SDE",
            ncs.SamplerDPMPP_2M_SDE,
            {"solver_type": "heun", "eta": 0.7, "s_noise": 1.0, "noise_device": "cpu"},
            "simple",
            4,
        ),  # noqa: E501
        (
            "SamplerDPMPP_SDE",
            ncs.SamplerDPMPP_SDE,
            {"eta": 1.0, "s_noise": 1.1, "r": 0.5, "noise_device": "cpu"},
            "beta",
            4,
        ),  # noqa: E501
        ("KSamplerSelect", ncs.KSamplerSelect, {"sampler_name": "uni_pc"}, "simple", 4),
        ("KSamplerSelect", ncs.KSamplerSelect, {"sampler_name": "ddim"}, "normal", 4),
    ]
    out = []
    for node, cls, node_inputs, scheduler, steps in specs:
        (sampler,) = getattr(cls(), cls.FUNCTION)(**node_inputs)
        function = sampler.sampler_function
        out.append(
            {
                "node": node,
                "inputs": node_inputs,
                "sampler": sampler,
                "record": {
                    "function": function.__name__,
                    "module": function.__module__,
                    "extra_options": {k: v for k, v in sampler.extra_options.items()},
                    "inpaint_options": dict(sampler.inpaint_options),
                },
                "scheduler": scheduler,
                "steps": steps,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE / JSON_NAME)
    args = parser.parse_args()
    torch.set_num_threads(1)  # reduction order independent of the machine's cores
    with tempfile.TemporaryDirectory(prefix="comfy-matrix-") as base:
        c = import_comfy(args.comfy.resolve(), Path(base))
        import comfy_extras.nodes_custom_sampler as ncs

        models, model_info = load_models(c, Path(base))
        graphs, records = inputs(c)
        samplers, schedulers = list(c.comfy.samplers.SAMPLER_NAMES), list(c.comfy.samplers.SCHEDULER_NAMES)
        cases = []
        for family, settings in MODELS.items():
            positive, negative, latent = graphs[family]
            for k, name in enumerate(samplers):
                scheduler = schedulers[(k + settings["offset"]) % len(schedulers)]
                seed = settings["seed"] + k
                with torch.no_grad():
                    (out,) = c.nodes.KSampler().sample(
                        models[family], seed, STEPS, settings["cfg"], name, scheduler, positive, negative, latent
                    )
                case = {"model": family, "node": "KSampler", "sampler": name, "scheduler": scheduler}
                case.update(seed=seed, steps=STEPS, cfg=settings["cfg"], output=tensor_json(out["samples"], DIGITS))
                cases.append(case)
                print(f"{family:5s} {name:32s} {scheduler:17s} |out| {out['samples'].norm():.4f}", flush=True)
        positive, negative, latent = graphs["flux"]
        for k, custom in enumerate(custom_samplers(c)):
            (sigmas,) = ncs.BasicScheduler().get_sigmas(models["flux"], custom["scheduler"], custom["steps"], 1.0)
            seed = 500 + k
            with torch.no_grad():
                (out, _) = ncs.SamplerCustom().sample(
                    models["flux"],
                    True,
                    seed,
                    MODELS["flux"]["cfg"],
                    positive,
                    negative,
                    custom["sampler"],
                    sigmas,
                    latent,
                )
            case = {
                "model": "flux",
                "node": "SamplerCustom",
                "sampler_node": custom["node"],
                "inputs": custom["inputs"],
            }
            case.update(custom["record"], scheduler=custom["scheduler"], steps=custom["steps"], seed=seed)
            case.update(
                cfg=MODELS["flux"]["cfg"], sigmas=tensor_json(sigmas), output=tensor_json(out["samples"], DIGITS)
            )
            cases.append(case)
            print(f"flux  SamplerCustom {custom['node']} {custom['inputs']}", flush=True)
        reference = {
            "generator": "tests/data/make_comfy_sampler_matrix_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT},
            "torch": torch.__version__,
            "names": {"samplers": samplers, "schedulers": schedulers},
            "models": model_info,
            "inputs": records,
            "cases": cases,
        }
    text = json.dumps(reference, separators=(",", ":"))
    args.out.write_text(text.replace('{"model":', '\n{"model":') + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
