"""Regenerate tests/data/gguf/*.gguf and tests/data/comfy_gguf_reference.json with ComfyUI-GGUF's OWN nodes.

Run by hand (not in CI) with the Python of ComfyUI's venv plus ``gguf`` (tests/comfyui/comfy_env.py builds it):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_gguf_reference.py \
        [--comfy ../shared/ComfyUI] [--gguf-nodes ../shared/ComfyUI-GGUF]

What it does, all on the CPU in float32 compute:
1. Writes tiny GGUF transformers as ComfyUI-GGUF's tools lay them out (tests/gguf_files.py; ``gguf`` package):
   the tiny original-layout Flux of the LoRA references (Q8_0, rows that are not whole blocks in F16), the tiny
   Qwen-Image of the Qwen-Image references (Q5_1) and a tiny Wan 2.1 (tests/data/wan_tiny_weights.py; Q4_K
   random valid blocks, its 5-D patch embedding appended as F32 the way fix_5d_tensors.py does).
2. Loads each with ComfyUI-GGUF's ``UnetLoaderGGUF`` (and ``UnetLoaderGGUFAdvanced`` with dequant_dtype
   float32), chains ``LoraLoaderModelOnly`` for the LoRA cases (ComfyUI's LoRA loader on ComfyUI-GGUF's
   GGUFModelPatcher) and runs ComfyUI's ``KSampler`` on fixed CONDITIONING. ComfyUI's detection takes Flux's and
   Qwen-Image's widths from the full-size models, so the tiny widths are added to the detected config (as the
   LoRA and Qwen-Image reference scripts do); nothing else is patched.

Nothing from parallel_runtime is imported (only tests/ and tests/data helpers: torch, safetensors, gguf).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import lora_files as lf  # noqa: E402
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from gguf_files import write_gguf  # noqa: E402 (tests/gguf_files.py: torch, numpy, gguf)
from wan_tiny_weights import TinyWan, hashed_uniform, tiny_wan_state_dict  # noqa: E402

GGUF_DIR = HERE / "gguf"
LORA_DIR = HERE / "lora"
QWEN_WIDTHS = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "joint_attention_dim": 24,
    "axes_dims_rope": [4, 6, 6],
}
MODELS = {  # name -> how the file is made
    "flux_Q8_0": {"family": "flux", "arch": "flux", "quant": "Q8_0", "fallback": "F16"},
    "qwen_image_Q5_1": {"family": "qwen-image", "arch": "qwen_image", "quant": "Q5_1", "fallback": "F16"},
    "wan_Q4_K": {"family": "wan", "arch": "wan", "quant": "Q4_K", "fallback": "F16"},
}
# The quantiser keeps Wan's text and time projections in F16; here they are Q4_K too (1.2 MB instead of 4.3).
TYPES = {
    "wan_Q4_K": {n: "Q4_K" for n in ("text_embedding.0.weight", "text_embedding.2.weight", "time_projection.1.weight")}
}
SAMPLING = {
    "flux": {"seed": 5, "steps": 4, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "guidance": 3.5},
    "qwen-image": {"seed": 6, "steps": 4, "cfg": 2.5, "sampler_name": "euler", "scheduler": "simple"},
    "wan": {"seed": 7, "steps": 3, "cfg": 3.0, "sampler_name": "euler", "scheduler": "simple"},
}
LATENTS = {"flux": (1, 16, 8, 8), "qwen-image": (1, 16, 1, 8, 8), "wan": (1, 16, 2, 6, 8)}
TOKENS = 6
CASES = [  # (name, model, dequant_dtype, LoRA stack [(file stem, strength)])
    ("flux_default", "flux_Q8_0", "default", []),
    ("flux_float32", "flux_Q8_0", "float32", []),
    ("flux_lora_stack", "flux_Q8_0", "default", [("flux_kohya", 0.8), ("flux_peft", -0.6)]),
    ("flux_lora_dora", "flux_Q8_0", "default", [("flux_dora", 0.75)]),
    ("flux_lora_float32", "flux_Q8_0", "float32", [("flux_kohya", 0.8)]),
    ("qwen_image_default", "qwen_image_Q5_1", "default", []),
    ("wan_default", "wan_Q4_K", "default", []),
]


def import_comfy(comfy_dir: Path, gguf_nodes: Path, base: Path) -> SimpleNamespace:
    stubbed = prepare_comfy(comfy_dir, base)
    import comfy.model_detection
    import comfy.model_management
    import comfy.samplers
    import folder_paths

    import nodes

    spec = importlib.util.spec_from_file_location(
        "comfyui_gguf", gguf_nodes / "__init__.py", submodule_search_locations=[str(gguf_nodes)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_gguf"] = package
    spec.loader.exec_module(package)
    return SimpleNamespace(
        comfy=comfy,
        folder_paths=folder_paths,
        nodes=nodes,
        gguf_nodes=sys.modules["comfyui_gguf.nodes"],
        stubbed=stubbed,
    )


def tiny_detection(c: SimpleNamespace):
    """ComfyUI's Flux / Qwen-Image detection fixes the full-size widths: read the tiny ones instead."""
    original = c.comfy.model_detection.detect_unet_config

    def detect(state_dict, key_prefix, metadata=None):
        config = original(state_dict, key_prefix, metadata)
        if isinstance(config, dict) and config.get("image_model") == "flux":
            hidden = state_dict[f"{key_prefix}img_in.weight"].shape[0]
            head = state_dict[f"{key_prefix}double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
            config.update(hidden_size=hidden, num_heads=hidden // head, axes_dim=list(lf.FLUX_CONFIG["axes_dim"]),
                          context_in_dim=state_dict[f"{key_prefix}txt_in.weight"].shape[1])  # fmt: skip
        if isinstance(config, dict) and config.get("image_model") == "qwen_image":
            config.update(QWEN_WIDTHS)
        return config

    return mock.patch.object(c.comfy.model_detection, "detect_unet_config", detect)


def sources() -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    reference = json.loads((HERE / "comfy_lora_reference.json").read_text())
    return {
        "flux": lf.base_state_dict(reference["models"]["flux"]["skeleton"]),
        "qwen-image": {k: v.float() for k, v in load_file(str(HERE / "tiny_qwen_image_bf16.safetensors")).items()},
        "wan": tiny_wan_state_dict(TinyWan(), "gguf"),
    }


def conditioning(family: str, name: str) -> list:
    if family == "flux":
        cond, pooled = lf.conditioning(f"gguf.{name}", TOKENS, lf.FLUX_CONFIG["context_in_dim"], 32)
        return [[cond, {"pooled_output": pooled, "guidance": SAMPLING["flux"]["guidance"]}]]
    width = QWEN_WIDTHS["joint_attention_dim"] if family == "qwen-image" else 4096
    return [[hashed_uniform(f"gguf/{family}/{name}", (1, TOKENS, width), 1.0), {}]]


def load(c: SimpleNamespace, file_name: str, dequant_dtype: str):
    with tiny_detection(c):
        if dequant_dtype == "default":
            (model,) = c.gguf_nodes.UnetLoaderGGUF().load_unet(file_name)
        else:
            (model,) = c.gguf_nodes.UnetLoaderGGUFAdvanced().load_unet(file_name, dequant_dtype, "default", False)
    if model.model.get_dtype() != torch.float32 and model.model.manual_cast_dtype not in (None, torch.float32):
        raise SystemExit(f"ComfyUI computes {file_name} in {model.model.get_dtype()}; the references need fp32")
    return model


def run_case(c: SimpleNamespace, model, family: str, loras: list) -> torch.Tensor:
    for stem, strength in loras:
        (model,) = c.nodes.LoraLoaderModelOnly().load_lora_model_only(model, f"{stem}.safetensors", strength)
    s = SAMPLING[family]
    (out,) = c.nodes.KSampler().sample(
        model, s["seed"], s["steps"], s["cfg"], s["sampler_name"], s["scheduler"],
        conditioning(family, "positive"), conditioning(family, "negative"), {"samples": torch.zeros(LATENTS[family])},
        denoise=1.0,
    )  # fmt: skip
    c.comfy.model_management.unload_all_models()
    return out["samples"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(args: argparse.Namespace, base: Path) -> None:
    c = import_comfy(args.comfy.resolve(), args.gguf_nodes.resolve(), base)
    torch.set_num_threads(1)
    models_dir = base / "models" / "unet"
    models_dir.mkdir(parents=True)
    c.folder_paths.add_model_folder_path("diffusion_models", str(models_dir), is_default=True)
    c.folder_paths.add_model_folder_path("loras", str(LORA_DIR), is_default=True)
    c.gguf_nodes.update_folder_names_and_paths("unet_gguf", ["diffusion_models", "unet"])
    GGUF_DIR.mkdir(exist_ok=True)
    states = sources()
    ref: dict = {
        "source": {
            "comfyui_commit": _commit(args.comfy),
            "comfyui_gguf_commit": _commit(args.gguf_nodes),
            "torch": torch.__version__,
            "gguf": importlib.metadata.version("gguf"),
            "script": "tests/data/make_comfy_gguf_reference.py",
            "stubbed_imports": c.stubbed,
        },
        "models": {},
        "sampling": SAMPLING,
        "tokens": TOKENS,
        "cases": {},
    }
    for name, spec in MODELS.items():
        path = write_gguf(GGUF_DIR / f"tiny_{name}.gguf", states[spec["family"]], spec["arch"], spec["quant"],
                          spec["fallback"], types=TYPES.get(name))  # fmt: skip
        shutil.copy(path, models_dir / path.name)
        ref["models"][name] = {**spec, "file": f"gguf/{path.name}", "sha256": sha256(path)}
    for case, model_name, dequant_dtype, loras in CASES:
        family = MODELS[model_name]["family"]
        model = load(c, f"tiny_{model_name}.gguf", dequant_dtype)
        latent = run_case(c, model, family, loras)
        ref["cases"][case] = {
            "model": model_name,
            "dequant_dtype": dequant_dtype,
            "loras": [list(x) for x in loras],
            "conditioning": "conditioning(family, 'positive' / 'negative') of this script (hash-valued)",
            "latent_shape": list(LATENTS[family]),
            "expected": tensor_json(latent),
        }
        print(f"{case}: |latent| {latent.norm():.5f}")
    default, exact = (torch.tensor(ref["cases"][k]["expected"]["data"]) for k in ("flux_default", "flux_float32"))
    ref["flux_default_vs_float32"] = float((default - exact).norm() / exact.norm())
    print(f"flux Q8_0: default vs float32 dequantisation moves the latent by {ref['flux_default_vs_float32']:.2e}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KiB)")


def _commit(folder: Path) -> str:
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown (not a git checkout)"


def _shared(name: str) -> Path:
    """``shared/<name>`` beside the repository or a folder above it (CI's layout, a nested worktree)."""
    for parent in HERE.parents:
        if (parent / "shared" / name).is_dir():
            return parent / "shared" / name
    return HERE.parents[2] / "shared" / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=_shared("ComfyUI"))
    parser.add_argument("--gguf-nodes", type=Path, default=_shared("ComfyUI-GGUF"))
    parser.add_argument("--out", type=Path, default=HERE / "comfy_gguf_reference.json")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-gguf-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
