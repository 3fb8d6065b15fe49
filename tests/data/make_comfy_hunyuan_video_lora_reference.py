"""Regenerate tests/data/comfy_hunyuan_video_lora_reference.json with ComfyUI's OWN LoRA code on the tiny
HunyuanVideo file.

Run by hand (not in CI) with the Python that imports the ComfyUI snapshot (nothing is written there):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_hunyuan_video_lora_reference.py \
        /work/shared/ComfyUI

What runs is ComfyUI's: the tiny text-to-video transformer of make_comfy_hunyuan_video_reference.py (Tencent's
names, loaded with ``comfy.sd.load_diffusion_model``), the LoRA files of ``hunyuan_video_lora_files`` written to a
temporary models/loras and chained with ``LoraLoaderModelOnly`` per case; the patched weights are read after
``patch_model`` (checksums and the first values of each, under Tencent's names: ComfyUI's own
``process_unet_state_dict`` says which of its tensors each one is) with the LoRA keys ComfyUI did not load, ComfyUI's name of every
module, and
``KSampler`` runs the stacked case on fixed CONDITIONING (as the HunyuanVideo reference gives it).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import hunyuan_video_lora_files as hl  # noqa: E402
from comfy_setup import tensor_json  # noqa: E402
from hunyuan_video_tiny_weights import TinyHunyuanVideo, tiny_hunyuan_video_state_dict  # noqa: E402
from make_comfy_hunyuan_video_reference import (  # noqa: E402
    HEIGHT,
    LENGTH,
    WIDTH,
    conditioning,
    import_comfy,
    load_model,
)
from make_comfy_lora_reference import stats  # noqa: E402
from make_comfy_wan_reference import COMFY_COMMIT, dump_json  # noqa: E402

SALT = "lora"
SAMPLING = {"seed": 5, "steps": 2, "cfg": 1.0, "sampler": "euler", "scheduler": "simple"}


class _NotLoaded(logging.Handler):
    def __init__(self):
        super().__init__()
        self.keys: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("lora key not loaded: "):
            self.keys.append(message[len("lora key not loaded: ") :])


def write_loras(base: Path) -> None:
    from safetensors.torch import save_file

    folder = base / "models" / "loras"
    folder.mkdir(parents=True, exist_ok=True)
    for stem, sd in hl.hunyuan_lora_files().items():
        save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / f"{stem}.safetensors"))


def apply_case(c, model, case):
    catcher = _NotLoaded()
    logging.getLogger().addHandler(catcher)
    try:
        for stem, strength in case:
            (model,) = c.nodes.LoraLoaderModelOnly().load_lora_model_only(model, f"{stem}.safetensors", strength)
    finally:
        logging.getLogger().removeHandler(catcher)
    return model, sorted(set(catcher.keys))


def tencent_names(c, original: dict[str, torch.Tensor]) -> dict[str, str]:
    """ComfyUI's tensor name (``diffusion_model.<its name>``) -> the Tencent name it was loaded from."""
    import comfy.supported_models as supported

    config = supported.HunyuanVideo({"image_model": "hunyuan_video"})
    out = {}
    for name in original:
        (internal,) = config.process_unet_state_dict({name: original[name]}).keys()
        out[f"diffusion_model.{internal}"] = name
    return out


def module_names(names: dict[str, str]) -> dict[str, str]:
    """Tencent's module name -> ComfyUI's, for every weight (norm scales, renamed beyond .weight, left out)."""
    cut = len(".weight")
    return {t[:-cut]: n[len("diffusion_model.") : -cut] for n, t in sorted(names.items()) if n.endswith(".weight")}


def patched_weights(c, model, names: dict[str, str]) -> dict[str, dict]:
    import comfy.model_management

    keys = sorted(model.patches)
    comfy.model_management.unload_all_models()
    model.patch_model()
    try:
        state = model.model.state_dict()
        return {names[k]: stats(state[k]) for k in keys}
    finally:
        model.unpatch_model()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("comfy_dir", type=Path)
    parser.add_argument("--commit", default=COMFY_COMMIT)
    parser.add_argument("--out", type=Path, default=HERE / "comfy_hunyuan_video_lora_reference.json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    cfg = TinyHunyuanVideo()
    with tempfile.TemporaryDirectory(prefix="comfy-hunyuan-lora-") as tmp:
        folder = Path(tmp)
        c = import_comfy(args.comfy_dir.resolve(), folder / "base")
        write_loras(folder / "base")
        base, info = load_model(c, folder, cfg, SALT)
        names = tencent_names(c, tiny_hunyuan_video_state_dict(cfg, SALT))
        patched = {}
        for case, stack in hl.CASES.items():
            model, not_loaded = apply_case(c, base, stack)
            patched[case] = {"weights": patched_weights(c, model, names), "not_loaded": not_loaded}
        model, _ = apply_case(c, base, hl.CASES["stack"])
        (latent,) = c.hunyuan.EmptyHunyuanLatentVideo().generate(WIDTH, HEIGHT, LENGTH, 1)
        pos, pos_recipe = conditioning("lora/positive", 9, cfg.text_dim)
        neg, neg_recipe = conditioning("lora/negative", 9, cfg.text_dim)
        s = SAMPLING
        runs = {}
        for case, m in (("none", base), ("stack", model)):
            (out,) = c.nodes.KSampler().sample(
                m, s["seed"], s["steps"], s["cfg"], s["sampler"], s["scheduler"], pos, neg, latent
            )
            runs[case] = tensor_json(out["samples"])
    ref = {
        "source": {
            "comfyui_commit": args.commit,
            "script": "tests/data/make_comfy_hunyuan_video_lora_reference.py",
            "torch": torch.__version__,
            "loras": "tests/data/hunyuan_video_lora_files.py",
        },
        "model": info,
        "comfy_names": module_names(names),
        "cases": hl.CASES,
        "patched": patched,
        "sampling": {
            **SAMPLING,
            "empty_latent": {"width": WIDTH, "height": HEIGHT, "length": LENGTH},
            "positive": pos_recipe,
            "negative": neg_recipe,
            "outputs": runs,
        },
    }
    args.out.write_text(dump_json(ref) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
