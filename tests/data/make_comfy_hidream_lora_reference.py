"""Regenerate tests/data/lora/hidream_*.safetensors and comfy_hidream_lora_reference.json with ComfyUI's OWN code.

Run by hand (not in CI) with the Python that imports ComfyUI (torch + torchvision + ComfyUI's requirements):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \
        tests/data/make_comfy_hidream_lora_reference.py --comfy /work/shared/ComfyUI

Writes two LoRA files for the tiny HiDream file of make_comfy_hidream_reference.py (comfy_ref_hidream.safetensors),
in the forms HiDream LoRAs come in: ``diffusion_model.<name>.lora_A / lora_B`` (ComfyUI's, ai-toolkit's) and
kohya's ``lora_unet_<name with _>.lora_down / lora_up / alpha``, on attention projections of both streams, a routed
and a shared expert, the text feed-forward, a caption projection, a modulation and the input / output layers.
Loads the file with ComfyUI's loader (the detection patched as in make_comfy_hidream_reference.py), chains
``LoraLoaderModelOnly`` per case, checks that ComfyUI loaded every LoRA key, and records KSampler's output on the
reference's conditioning. Nothing from parallel_runtime is imported.
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
from make_comfy_hidream_reference import FILE_NAME, QuadBuilder, detection_overrides  # noqa: E402
from make_comfy_ksampler_reference import COMFY_COMMIT, maker, run_case  # noqa: E402

JSON_NAME = "comfy_hidream_lora_reference.json"
LORA_DIR = HERE / "lora"
RANK = 4
MODULES = (  # module names (the release's, diffusers' own); shapes read from the file
    "double_stream_blocks.0.block.attn1.to_q",
    "double_stream_blocks.1.block.attn1.to_v_t",
    "double_stream_blocks.0.block.ff_t.w2",
    "single_stream_blocks.0.block.ff_i.experts.2.w1",
    "single_stream_blocks.1.block.ff_i.shared_experts.w3",
    "single_stream_blocks.1.block.adaLN_modulation.1",
    "caption_projection.3.linear",
    "x_embedder.proj",
    "final_layer.linear",
)
CASES = {
    "peft": [("hidream_lora_peft", 1.0)],
    "stack": [("hidream_lora_peft", 0.8), ("hidream_lora_kohya", -0.5)],
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
    return {"hidream_lora_peft": peft, "hidream_lora_kohya": kohya}


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
        b = QuadBuilder(c)
        pos, neg = b.hidream_text("hidream_pos", 7, 6), b.hidream_text("hidream_neg", 3, 4)
        mk = maker({"seed": 13, "steps": 3, "cfg": 5.0, "sampler_name": "euler", "scheduler": "simple"})
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
            spec = mk(f"hidream_lora_{case}", f"LoraLoaderModelOnly {chain}", pos, neg, b.empty_latent(64, 64))
            record = run_case(c, b, {None: model}, {**spec, "model": None})
            records.append({**record, "loras": [list(x) for x in chain], "patched_weights": patched})
        reference = {
            "generator": "tests/data/make_comfy_hidream_lora_reference.py",
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
