"""Regenerate tests/data/comfy_ref_hidream_fp8_scaled.safetensors and comfy_hidream_fp8_reference.json with
ComfyUI's OWN loader and KSampler.

Run by hand (not in CI) with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_hidream_fp8_reference.py --comfy /work/shared/ComfyUI

1. Writes the tiny HiDream-I1 of comfy_ref_hidream.safetensors (make_comfy_hidream_reference.py) in ComfyUI's
   "fp8 scaled" layout (tests/bigmodel_files.py ``to_fp8``: the ``scaled_fp8`` marker, every Linear weight
   float8_e4m3fn with its ``.scale_weight``); the MoE gates, which are plain parameters, and every other tensor
   in bf16.
2. Loads it with ComfyUI's real loader (``comfy.sd.load_diffusion_model``, what UNETLoader calls; CPU, compute in
   float32) and runs ComfyUI's KSampler on make_comfy_hidream_reference.py's CONDITIONING and cases.

The only patch is make_comfy_hidream_reference.py's detection width override. Nothing from parallel_runtime is
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from bigmodel_files import to_fp8  # noqa: E402 (tests/bigmodel_files.py: torch, safetensors)
from comfy_reference_models import import_comfy  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from make_comfy_hidream_reference import FILE_NAME, QuadBuilder, detection_overrides, hidream_cases  # noqa: E402
from make_comfy_ksampler_reference import COMFY_COMMIT, run_case  # noqa: E402

JSON_NAME = "comfy_hidream_fp8_reference.json"
FP8_NAME = "comfy_ref_hidream_fp8_scaled.safetensors"
CASES = ("hidream_default_euler", "hidream_dev_cfg1")
GATE = ".ff_i.gate.weight"


def fp8_scaled(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = to_fp8({k: v for k, v in state.items() if not k.endswith(GATE)}, "scaled")
    out.update({k: v.to(torch.bfloat16) for k, v in state.items() if k.endswith(GATE)})
    return out


def main() -> None:
    from safetensors.torch import load_file, save_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        overrides = detection_overrides(c)
        state = fp8_scaled({k: v.float() for k, v in load_file(str(HERE / FILE_NAME)).items()})
        path = args.out / FP8_NAME
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
        model = c.comfy.sd.load_diffusion_model(str(path), model_options={"dtype": torch.float32})
        if type(model.model).__name__ != "HiDream":
            raise SystemExit(f"ComfyUI detected {type(model.model).__name__}, not HiDream")
        block = model.model.diffusion_model.double_stream_blocks[0].block
        loaded = {
            "scaled_fp8": str(model.model.model_config.scaled_fp8),
            "manual_cast_dtype": str(model.model.manual_cast_dtype),
            "attn1.to_q.weight": str(block.attn1.to_q.weight.dtype),
            "attn1.to_q.bias": str(block.attn1.to_q.bias.dtype),
            "ff_i.gate.weight": str(block.ff_i.gate.weight.dtype),
        }
        print(loaded)
        b = QuadBuilder(c)
        cases = {case["name"]: case for case in hidream_cases(c, b)}
        records = [run_case(c, b, {"hidream": model}, cases[name]) for name in CASES]
        reference = {
            "generator": "tests/data/make_comfy_hidream_fp8_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "source": f"{FILE_NAME} (make_comfy_hidream_reference.py) as fp8 scaled (tests/bigmodel_files.py)",
            "file": FP8_NAME,
            "loaded": loaded,
            "detection_overrides": overrides,
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
        print(f"{r['name']:35s} {status}")
    print(f"wrote {out} ({out.stat().st_size} bytes), {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
