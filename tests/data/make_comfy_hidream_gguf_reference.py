"""Regenerate tests/data/gguf/tiny_hidream_*.gguf and comfy_hidream_gguf_reference.json with ComfyUI-GGUF's OWN
nodes.

Run by hand (not in CI) with the Python of ComfyUI's venv that has ``gguf`` (tests/comfyui/comfy_env.py builds it):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_hidream_gguf_reference.py [--comfy ../shared/ComfyUI] [--gguf-nodes ../shared/ComfyUI-GGUF]

1. Writes the tiny HiDream-I1 of tests/data/comfy_ref_hidream.safetensors (make_comfy_hidream_reference.py) as
   GGUF files laid out as ComfyUI-GGUF's tools write them (tests/gguf_files.py, architecture "hidream": the
   release's names, embedders / caption projections / final layer in the fallback type, the MoE gates F32), in
   Q8_0 and Q4_0 (the attention projections quantised too, see ``attention_types``), and in Q4_K and Q6_K: random
   valid blocks in every weight whose rows are whole 256-value blocks (the experts' and feed-forwards' w2), the
   rest in the fallback type.
2. Loads each with ComfyUI-GGUF's ``UnetLoaderGGUF`` and runs ComfyUI's ``KSampler`` (ModelSamplingSD3 where a case
   names it) on the CONDITIONING of make_comfy_hidream_reference.py's cases (QuadrupleCLIPLoader + CLIPTextEncode's
   shape: T5 states, pooled CLIPs, conditioning_llama3), all on the CPU in float32 compute; one case also through
   ``LoraLoaderModelOnly`` with make_comfy_hidream_lora_reference.py's two LoRA files stacked.

The only patch is make_comfy_hidream_reference.py's: ComfyUI's detection hard-codes HiDream's published widths,
replaced by the tiny ones. Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from comfy_reference_models import import_comfy  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from gguf_files import write_gguf  # noqa: E402 (tests/gguf_files.py: torch, numpy, gguf)
from make_comfy_hidream_reference import FILE_NAME, QuadBuilder, detection_overrides, hidream_cases  # noqa: E402
from make_comfy_ksampler_reference import COMFY_COMMIT, run_case  # noqa: E402

JSON_NAME = "comfy_hidream_gguf_reference.json"
GGUF_DIR = HERE / "gguf"
# quantised type -> the fallback of the kept / non-block tensors
QUANTS = {"Q8_0": "F16", "Q4_0": "BF16", "Q4_K": "F16", "Q6_K": "BF16"}
CASES = {  # quantised type -> the cases of make_comfy_hidream_reference.py it samples
    "Q8_0": ("hidream_default_euler", "hidream_full_shift3_dpmpp_2m"),
    "Q4_0": ("hidream_default_euler",),
    "Q4_K": ("hidream_default_euler",),
    "Q6_K": ("hidream_default_euler",),
}
LORA_DIR = HERE / "lora"
# LoraLoaderModelOnly on UnetLoaderGGUF's model (make_comfy_hidream_lora_reference.py's files: quantised
# attention and experts, F32 caption projection, F16 input / output layers): (quantised type, case, stack)
LORA_CASES = (("Q8_0", "hidream_default_euler", (("hidream_lora_peft", 0.8), ("hidream_lora_kohya", -0.5))),)


def attention_types(state: dict[str, torch.Tensor], quant: str) -> dict[str, str]:
    """The converter leaves tensors of at most 1024 values in F32, which at the tiny width are the 32 x 32
    attention projections; here they are ``quant`` too, as in the published files. (A K type's 256-value blocks do
    not fit their 32-value rows: those keep the fallback type, as the quantiser would.)"""
    if quant.endswith("_K"):
        return {}
    return {k: quant for k, v in state.items() if ".attn1.to_" in k and k.endswith(".weight") and v.ndim == 2}


def load_gguf_nodes(gguf_nodes: Path):
    spec = importlib.util.spec_from_file_location(
        "comfyui_gguf", gguf_nodes / "__init__.py", submodule_search_locations=[str(gguf_nodes)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_gguf"] = package
    spec.loader.exec_module(package)
    return sys.modules["comfyui_gguf.nodes"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(args: argparse.Namespace, base: Path) -> None:
    from safetensors.torch import load_file

    c = import_comfy(args.comfy.resolve(), base)
    gguf_nodes = load_gguf_nodes(args.gguf_nodes.resolve())
    import folder_paths

    torch.set_num_threads(1)
    overrides = detection_overrides(c)
    models_dir = base / "models" / "unet"
    models_dir.mkdir(parents=True)
    folder_paths.add_model_folder_path("diffusion_models", str(models_dir), is_default=True)
    folder_paths.add_model_folder_path("loras", str(LORA_DIR), is_default=True)
    gguf_nodes.update_folder_names_and_paths("unet_gguf", ["diffusion_models", "unet"])
    GGUF_DIR.mkdir(exist_ok=True)
    state = {k: v.float() for k, v in load_file(str(HERE / FILE_NAME)).items()}
    b = QuadBuilder(c)
    cases = {case["name"]: case for case in hidream_cases(c, b)}
    models, records, info = {}, [], {}
    for quant, fallback in QUANTS.items():
        path = write_gguf(GGUF_DIR / f"tiny_hidream_{quant}.gguf", state, "hidream", quant, fallback,
                          prefix="model.diffusion_model.", types=attention_types(state, quant))  # fmt: skip
        shutil.copy(path, models_dir / path.name)
        (model,) = gguf_nodes.UnetLoaderGGUF().load_unet(path.name)
        if type(model.model).__name__ != "HiDream":
            raise SystemExit(f"ComfyUI detected {type(model.model).__name__}, not HiDream")
        if model.model.get_dtype() != torch.float32 and model.model.manual_cast_dtype not in (None, torch.float32):
            raise SystemExit(f"ComfyUI computes {path.name} in {model.model.get_dtype()}; the references need fp32")
        models[quant] = model
        info[quant] = {"file": f"gguf/{path.name}", "sha256": sha256(path), "quant": quant, "fallback": fallback}
        for name in CASES[quant]:
            case = {**cases[name], "name": f"{quant}.{name}", "model": quant}
            records.append(run_case(c, b, models, case))
        for lora_quant, name, stack in LORA_CASES:
            if lora_quant != quant:
                continue
            patched = model
            for stem, strength in stack:
                (patched,) = c.nodes.LoraLoaderModelOnly().load_lora_model_only(
                    patched, f"{stem}.safetensors", strength
                )
            case = {**cases[name], "name": f"{quant}.lora.{name}", "model": "patched"}
            record = run_case(c, b, {"patched": patched}, case)
            records.append(
                {**record, "model": quant, "loras": [list(x) for x in stack], "patches": len(patched.patches)}
            )
        c.comfy.model_management.unload_all_models()
    reference = {
        "generator": "tests/data/make_comfy_hidream_gguf_reference.py",
        "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
        "comfyui_gguf": {"path": str(args.gguf_nodes)},
        "torch": torch.__version__,
        "gguf": importlib.metadata.version("gguf"),
        "source": f"{FILE_NAME} (make_comfy_hidream_reference.py), written as GGUF by tests/gguf_files.py",
        "detection_overrides": overrides,
        "models": info,
        "cases": records,
        "tensors": {k: tensor_json(v) for k, v in sorted(b.tensors.items())},
    }
    tensors = reference.pop("tensors")
    compact = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in tensors.items())
    text = json.dumps(reference, indent=1)[:-2] + ',\n "tensors": {\n' + compact + "\n }\n}\n"
    json.loads(text)  # well-formed
    out = args.out / JSON_NAME
    out.write_text(text, encoding="utf-8")
    for r in records:
        status = r.get("comfy_error") or f"ok |samples| {b.tensors[r['expected']['samples']].norm():.5f}"
        print(f"{r['name']:40s} {status}")
    print(f"wrote {out} ({out.stat().st_size} bytes)")


def _shared(name: str) -> Path:
    """``shared/<name>`` beside the repository or a folder above it (CI's layout, a nested worktree)."""
    for parent in HERE.parents:
        if (parent / "shared" / name).is_dir():
            return parent / "shared" / name
    return HERE.parents[2] / "shared" / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=_shared("ComfyUI"))
    parser.add_argument("--gguf-nodes", type=Path, default=_shared("ComfyUI-GGUF"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-hidream-gguf-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
