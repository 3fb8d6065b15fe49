"""Regenerate tests/data/lora/chroma_*.safetensors and comfy_chroma_lora_reference.json with ComfyUI's OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + ComfyUI's requirements):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_chroma_lora_reference.py --comfy /work/shared/ComfyUI

Writes two LoRA files for the tiny Chroma file of make_comfy_chroma_reference.py (comfy_ref_chroma.safetensors),
in the forms Chroma LoRAs come in: ``diffusion_model.<original name>.lora_A / lora_B`` (ComfyUI's and ai-toolkit's
form) and kohya's ``lora_unet_<original name with _>.lora_down / lora_up / alpha``, on the modules a Chroma LoRA
trains: the fused image q-k-v, a double block's text MLP, single blocks' linear1 / linear2, the approximator's
layers (distilled_guidance_layer) and the input / output layers. Loads the file with ComfyUI's loader (the
detection widths patched as in make_comfy_chroma_reference.py), chains ``LoraLoaderModelOnly`` per case, checks
that ComfyUI loaded every LoRA key, and records KSampler's output on the reference's conditioning.
Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_reference_models import import_comfy, randn  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from make_comfy_chroma_reference import CHROMA, FILE_NAME, T5Builder, detection_overrides  # noqa: E402
from make_comfy_ksampler_reference import COMFY_COMMIT, maker, run_case  # noqa: E402

JSON_NAME = "comfy_chroma_lora_reference.json"
LORA_DIR = HERE / "lora"
RANK = 4
MODULES = (  # original-layout modules (their weights' shapes are read from the file)
    "double_blocks.0.img_attn.qkv",
    "double_blocks.3.txt_mlp.0",
    "single_blocks.5.linear1",
    "single_blocks.37.linear2",
    "distilled_guidance_layer.layers.0.in_layer",
    "distilled_guidance_layer.in_proj",
    "img_in",
    "final_layer.linear",
)
CASES = {
    "peft": [("chroma_lora_peft", 1.0)],
    "stack": [("chroma_lora_peft", 0.8), ("chroma_lora_kohya", -0.5)],
}


def lora_files(state: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    peft, kohya = {}, {}
    for i, module in enumerate(MODULES):
        out_f, in_f = state[f"{module}.weight"].shape
        down, up = randn(f"lora/{module}/A", (RANK, in_f), 0.2), randn(f"lora/{module}/B", (out_f, RANK), 0.2)
        peft[f"diffusion_model.{module}.lora_A.weight"] = down.to(torch.bfloat16)
        peft[f"diffusion_model.{module}.lora_B.weight"] = up.to(torch.bfloat16)
        if i % 2 == 0:  # kohya on every other module: the two files overlap on some, not on others
            name = "lora_unet_" + module.replace(".", "_")
            kohya[f"{name}.lora_down.weight"] = randn(f"kohya/{module}/down", (RANK, in_f), 0.2).to(torch.bfloat16)
            kohya[f"{name}.lora_up.weight"] = randn(f"kohya/{module}/up", (out_f, RANK), 0.2).to(torch.bfloat16)
            kohya[f"{name}.alpha"] = torch.tensor(2.0)
    return {"chroma_lora_peft": peft, "chroma_lora_kohya": kohya}


class _NotLoaded(logging.Handler):
    def __init__(self):
        super().__init__()
        self.keys: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("lora key not loaded: "):
            self.keys.append(message[len("lora key not loaded: ") :])


def main() -> None:
    from safetensors.torch import load_file, save_file

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    files = lora_files(load_file(str(HERE / FILE_NAME)))
    LORA_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="comfy-base-") as base_dir:
        loras = Path(base_dir) / "models" / "loras"
        loras.mkdir(parents=True)
        for stem, sd in files.items():
            save_file(sd, str(LORA_DIR / f"{stem}.safetensors"))
            save_file(sd, str(loras / f"{stem}.safetensors"))
        c = import_comfy(args.comfy.resolve(), Path(base_dir))
        detection_overrides(c)
        base = c.comfy.sd.load_diffusion_model(str(HERE / FILE_NAME), model_options={"dtype": torch.float32})
        b = T5Builder(c)
        pos, neg = b.text("chroma_pos", 7, CHROMA["context"], None), b.text("chroma_neg", 2, CHROMA["context"], None)
        mk = maker({"seed": 13, "steps": 3, "cfg": 4.0, "sampler_name": "euler", "scheduler": "simple"})
        records = []
        for case, chain in CASES.items():
            catcher = _NotLoaded()
            logging.getLogger().addHandler(catcher)
            model = base
            try:
                for stem, strength in chain:
                    (model,) = c.nodes.LoraLoaderModelOnly().load_lora_model_only(
                        model, f"{stem}.safetensors", strength
                    )
            finally:
                logging.getLogger().removeHandler(catcher)
            if catcher.keys:
                raise SystemExit(f"{case}: ComfyUI did not load {catcher.keys}")
            patched = len(model.patches)
            spec = mk(f"chroma_lora_{case}", f"LoraLoaderModelOnly {chain}", pos, neg, b.empty_latent(64, 48))
            record = run_case(c, b, {None: model}, {**spec, "model": None})
            records.append({**record, "loras": [list(x) for x in chain], "patched_weights": patched})
        reference = {
            "generator": "tests/data/make_comfy_chroma_lora_reference.py",
            "comfyui": {"version": "0.3.64", "commit": COMFY_COMMIT, "path": str(args.comfy)},
            "torch": torch.__version__,
            "model": FILE_NAME,
            "modules": list(MODULES),
            "rank": RANK,
            "cases": records,
            "tensors": {k: tensor_json(v) for k, v in sorted(b.tensors.items())},
        }
    out = HERE / JSON_NAME
    out.write_text(json.dumps(reference, indent=1) + "\n", encoding="utf-8")
    for r in records:
        print(r["name"], r["patched_weights"], "patched", r.get("comfy_error", "ok"))
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
