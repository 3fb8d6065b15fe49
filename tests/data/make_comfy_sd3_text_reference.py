"""Regenerate the tiny SD3 T5 files (tests/data/tiny_sd3_t5_{fp16,fp8_e4m3fn_scaled}.safetensors) and
tests/data/comfy_sd3_text_reference.json with ComfyUI's OWN TripleCLIPLoader (CLIP-L + CLIP-G + T5-XXL) and
DualCLIPLoader (type sd3: CLIP-L + CLIP-G, CLIP-L + T5-XXL) + CLIPTextEncode.

Run by hand (not in CI), with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \\
        tests/data/make_comfy_sd3_text_reference.py --comfy /work/shared/ComfyUI

What it does, all on the CPU:
1. Builds the seeded random tiny T5 v1.1 encoder of make_comfy_t5xxl_reference.py, but 208 wide (SD3 pads the
   CLIP tokens, 64 + 128 wide here, to T5's width), and saves it in t5xxl_fp16's layout (float16) and in
   t5xxl_fp8_e4m3fn_scaled's (Linear weights e4m3fn with scale_weight, the scaled_fp8 marker); and a tiny CLIP-L
   (tests/data/tiny_sd3_clip_l.safetensors: make_comfy_hidream_text_reference.py's CLIP-L, 64 wide, but 3 layers:
   ComfyUI reads SD3's CLIP-L at its penultimate layer and wants more than 2). CLIP-G is
   tests/data/tiny_hidream_clip_g (128 wide, 3 layers, with its projection), read as it is.
2. Loads the files with ``TripleCLIPLoader`` (T5 fp16 / fp8-scaled, the files in shuffled orders) and with
   ``DualCLIPLoader`` type sd3 (CLIP-L + CLIP-G; CLIP-L + T5), and stores ``CLIPTextEncode``'s CONDITIONING of
   each case's prompts: the tokens (without T5, ComfyUI pads the CLIP tokens to 4096 columns: the first 192 are
   stored with the largest magnitude of the rest) and ``pooled_output``.

Patched, all sizes, as make_comfy_hidream_text_reference.py patches them (its ``patches``: the text-encoder
detection by the tiny files' tensors, the configs and special tokens, the 49408-row token table, the tokenizer
folders -> tests/data's tiny ones), plus ``SD3ClipModel.load_sd``'s dispatch (ComfyUI tells CLIP-G by a 31st layer,
CLIP-L by a 2nd; here by width) and, where a T5 is loaded, the T5-XXL width SD3's text encoder pads the CLIP tokens
to (4096 -> the tiny T5's 208: ``sd3_clip``'s ``torch.nn.functional.pad`` sees it through a stand-in). ComfyUI's
768 / 1280 (CLIP-L's / CLIP-G's widths: zeros for a missing one) are left as they are. Nothing from
parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import types
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_comfy_hidream_text_reference as hidream  # noqa: E402 (tiny CLIP files and their patches)
import make_comfy_umt5_reference as umt5  # noqa: E402 (tiny T5 weights, fp8 layout)
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402

T5_WIDTH = 208  # >= 64 + 128 (the tiny CLIPs), padded past them
T5_VOCAB = 400  # make_comfy_t5xxl_reference.VOCAB
CLIP_COLUMNS = 64 + 128
CLIP_L = (64, 1, 3, 128, 64)  # hidream.CLIPS' CLIP-L with a third layer (width, heads, layers, feed-forward, proj.)
FILES = {
    "t5_fp16": "tiny_sd3_t5_fp16.safetensors",
    "t5_fp8_scaled": "tiny_sd3_t5_fp8_e4m3fn_scaled.safetensors",
    "clip_l": "tiny_sd3_clip_l.safetensors",
    "clip_g": hidream.FILES["clip_g"],
}
PROMPTS = [
    "a red fox in the snow",
    "a (red:1.3) fox in the ((snow)), \\(literal\\) parentheses",
    # past CLIP's 77 tokens: a run of 8+ tokens is cut at the chunk's end, a shorter one moves whole
    "a photo of " + "cat " * 70 + "(qwzxqwzxqwzx qwzx:1.1) " + " ".join(["a red chair in the garden"] * 3),
]
CASES = {  # name -> (loader, files, prompt indices)
    "triple_fp16": ("triple", ["t5_fp16", "clip_g", "clip_l"], [0, 1]),
    "triple_fp8_scaled": ("triple", ["clip_l", "t5_fp8_scaled", "clip_g"], [0]),
    "dual_clip_l_clip_g": ("dual", ["clip_g", "clip_l"], [1, 2]),
    "dual_clip_l_t5": ("dual", ["t5_fp16", "clip_l"], [0]),
}


def tiny_t5() -> dict[str, torch.Tensor]:
    return umt5.tiny_umt5(T5_VOCAB, table_per_block=False)  # T5_WIDTH wide: main() sets umt5.WIDTH


def _sd3_torch(width: int):
    """``sd3_clip``'s torch with T5-XXL's 4096 columns as ``width``: pad(x, (0, 4096 - w)) -> (0, width - w)."""
    real_pad = torch.nn.functional.pad

    def pad(x, amounts, *args, **kwargs):
        if amounts[0] == 0:
            amounts = (0, amounts[1] - 4096 + width)
        return real_pad(x, amounts, *args, **kwargs)

    class Forward(types.SimpleNamespace):
        def __getattr__(self, name):  # everything else: the real module's
            return getattr(self.real, name)

    functional = Forward(real=torch.nn.functional, pad=pad)
    stand_in = Forward(real=torch, nn=Forward(real=torch.nn, functional=functional))
    return stand_in


def sd3_patches(base: Path, clip_tokenizer, llama_tokenizer, with_t5: bool):
    import comfy.sd
    import comfy.text_encoders.sd3_clip as sd3_clip

    def load_sd(self, sd):
        kind = hidream._kind(sd)
        return getattr(self, {"t5": "t5xxl", "clip_l": "clip_l", "clip_g": "clip_g"}[kind]).load_sd(sd)

    def t5_detect(data):  # the tiny T5's 24th block is missing; no T5, nothing (as ComfyUI's own)
        t5 = [sd for sd in data if "encoder.final_layer_norm.weight" in sd]
        return sd3_clip.t5_xxl_detect(t5[0]) if t5 else {}

    extra = [
        mock.patch.object(sd3_clip.SD3ClipModel, "load_sd", load_sd),
        mock.patch.object(comfy.sd, "t5xxl_detect", t5_detect),
    ]
    if with_t5:
        extra.append(mock.patch.object(sd3_clip, "torch", _sd3_torch(T5_WIDTH)))
    return umt5._patches(hidream.patches(base, clip_tokenizer, llama_tokenizer), *extra)


def run(args, base: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, CLIPTokenizer

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401
    from comfy_extras.nodes_sd3 import TripleCLIPLoader

    import nodes

    clip_tokenizer = CLIPTokenizer.from_pretrained(str(hidream.CLIP_TOKENIZER))
    llama_tokenizer = AutoTokenizer.from_pretrained(str(hidream.LLAMA_TOKENIZER))
    t5 = tiny_t5()
    clip_l = hidream.tiny_clip("clip_l", len(clip_tokenizer))
    save_file({k: v.half().contiguous() for k, v in clip_l.items()}, str(HERE / FILES["clip_l"]))
    save_file({k: v.half().contiguous() for k, v in t5.items()}, str(HERE / FILES["t5_fp16"]))
    save_file({k: v.contiguous() for k, v in umt5.scaled_fp8(t5).items()}, str(HERE / FILES["t5_fp8_scaled"]))
    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES.values():
        shutil.copy(HERE / name, folder / name)
    reference = {
        "comfyui_commit": umt5._git(args.comfy),
        "command": "PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python "
        "tests/data/make_comfy_sd3_text_reference.py --comfy /work/shared/ComfyUI",
        "prompts": PROMPTS,
        "files": FILES,
        "clip_columns": CLIP_COLUMNS,
        "cases": {},
    }
    for case, (loader, kinds, prompts) in CASES.items():
        names = [FILES[k] for k in kinds]
        with sd3_patches(base, clip_tokenizer, llama_tokenizer, any(k.startswith("t5") for k in kinds)):
            if loader == "triple":
                clip = TripleCLIPLoader.execute(*names).result[0]
            else:
                (clip,) = nodes.DualCLIPLoader().load_clip(*names, type="sd3")
            rows = []
            for index in prompts:
                (cond,) = nodes.CLIPTextEncode().encode(clip, PROMPTS[index])
                tokens, options = cond[0][0][0], cond[0][1]
                wide = tokens.shape[-1] > T5_WIDTH  # no T5: 4096 columns, zero past the CLIPs'
                rows.append(
                    {
                        "prompt": index,
                        "shape": list(tokens.shape),
                        "cond": tensor_json(tokens[:, :CLIP_COLUMNS] if wide else tokens),
                        "rest_max": float(tokens[:, CLIP_COLUMNS:].abs().max()) if wide else None,
                        "pooled": tensor_json(options["pooled_output"][0]),
                        "extra": sorted(k for k in options if k != "pooled_output"),
                    }
                )
        reference["cases"][case] = {"files": names, "conditioning": rows}
        print(case, [(r["shape"], r["pooled"]["shape"], r["rest_max"]) for r in rows], rows[0]["extra"])
    (HERE / "comfy_sd3_text_reference.json").write_text(json.dumps(reference) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-sd3-text-ref-"))
    try:
        # the tiny CLIP-L built and read with 3 layers, the tiny T5 T5_WIDTH wide
        with mock.patch.dict(hidream.CLIPS, {"clip_l": CLIP_L}), mock.patch.object(umt5, "WIDTH", T5_WIDTH):
            run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
