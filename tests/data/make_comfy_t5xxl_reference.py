"""Regenerate the tiny T5 (v1.1) text-encoder files (tests/data/tiny_t5_*) and tests/data/comfy_t5xxl_reference.json
with ComfyUI's OWN CLIPLoader (types "chroma" and "sd3") + CLIPTextEncode, and ComfyUI-GGUF's CLIPLoaderGGUF.

Run by hand (not in CI), as make_comfy_umt5_reference.py (whose helpers it uses):

    PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_t5xxl_reference.py

What it does, all on the CPU:
1. Builds a seeded random T5 v1.1 encoder (32 wide, 2 heads of 16, feed-forward 64, 2 blocks, ONE position table
   in the first block) under the original names, its vocabulary the tiny T5 tokenizer's
   (tests/data/tiny_t5_tokenizer: tiny-chroma's, a T5 tokenizer of 390 pieces, copied from dit_devtools' tiny
   model), and saves it as t5xxl_fp16's layout (bf16), t5xxl_fp8_e4m3fn_scaled's (Linear weights e4m3fn with
   scale_weight, the scaled_fp8 marker) and t5-v1_1-xxl-encoder-Q8_0.gguf's (llama.cpp's, Q8_0).
2. Loads them with ``CLIPLoader`` type chroma (all three layouts; the GGUF with ``CLIPLoaderGGUF``) and type sd3
   (bf16 and the GGUF: T5 alone, no CLIP-L / CLIP-G), encodes the prompts with ``CLIPTextEncode`` and stores each
   CONDITIONING with its pooled output.

Patched, all sizes: the T5-XXL detection and the weight-dtype / fp8 read (a 24th block 4096 wide, as in
make_comfy_umt5_reference.py), T5's config (``t5_config_xxl.json`` -> the tiny sizes) and the tokenizer folder
ComfyUI's T5 tokenizers read (``comfy/text_encoders/t5_tokenizer`` -> the tiny one; the full one has 32100
pieces). Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_comfy_umt5_reference as umt5  # noqa: E402 (the sibling generator: tiny weights, layouts, patches)
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402

TOKENIZER = HERE / "tiny_t5_tokenizer"
VOCAB = 400  # the tokenizer's 390 pieces and spare rows, as T5-XXL's 32128 rows hold 32100 pieces
FILES = {
    "bf16": "tiny_t5_bf16.safetensors",
    "fp8_scaled": "tiny_t5_fp8_e4m3fn_scaled.safetensors",
    "Q8_0": "tiny_t5_Q8_0.gguf",
}
CASES = [("chroma", "bf16"), ("chroma", "fp8_scaled"), ("chroma", "Q8_0"), ("sd3", "bf16"), ("sd3", "Q8_0")]
PROMPTS = [
    "a red fox in the snow",
    "A lighthouse at dusk, waves crashing against the rocks at night.",
    "",
    "a (red:1.3) fox in the ((snow)), \\(literal\\) parentheses",  # ComfyUI's weight syntax
    "(a lighthouse:0.8) at dusk (unclosed",
]


def tiny_patches(config: Path):
    import comfy.sd
    import comfy.sd1_clip
    import comfy.text_encoders.sd3_clip

    model_init, tokenizer_init = comfy.sd1_clip.SDClipModel.__init__, comfy.sd1_clip.SDTokenizer.__init__

    def model(self, *args, textmodel_json_config=None, **kwargs):
        if textmodel_json_config and str(textmodel_json_config).endswith("t5_config_xxl.json"):
            textmodel_json_config = str(config)
        return model_init(self, *args, textmodel_json_config=textmodel_json_config, **kwargs)

    def tokenizer(self, tokenizer_path=None, *args, **kwargs):
        if tokenizer_path and str(tokenizer_path).endswith("t5_tokenizer"):
            tokenizer_path = str(TOKENIZER)
        return tokenizer_init(self, tokenizer_path, *args, **kwargs)

    return umt5._patches(
        mock.patch.object(comfy.sd, "detect_te_model", lambda sd: comfy.sd.TEModel.T5_XXL),
        mock.patch.object(comfy.sd, "t5xxl_detect", lambda data: comfy.text_encoders.sd3_clip.t5_xxl_detect(data[0])),
        mock.patch.object(comfy.sd1_clip.SDClipModel, "__init__", model),
        mock.patch.object(comfy.sd1_clip.SDTokenizer, "__init__", tokenizer),
    )


def run(args, base: Path) -> None:
    from safetensors.torch import save_file

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401

    import nodes

    spec = importlib.util.spec_from_file_location(
        "comfyui_gguf", args.gguf_nodes / "__init__.py", submodule_search_locations=[str(args.gguf_nodes)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_gguf"] = package
    spec.loader.exec_module(package)
    gguf_nodes = sys.modules["comfyui_gguf.nodes"]

    tensors = umt5.tiny_umt5(VOCAB, table_per_block=False)
    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(HERE / FILES["bf16"]))
    save_file({k: v.contiguous() for k, v in umt5.scaled_fp8(tensors).items()}, str(HERE / FILES["fp8_scaled"]))
    umt5.write_gguf(tensors, None, HERE / FILES["Q8_0"])
    for name in FILES.values():
        shutil.copy(HERE / name, folder / name)
    config = base / "tiny_t5_config.json"
    config.write_text(json.dumps({**umt5.comfy_config(VOCAB), "model_type": "t5"}))
    reference = {
        "comfyui_commit": umt5._git(args.comfy),
        "command": "PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python "
        "tests/data/make_comfy_t5xxl_reference.py",
        "prompts": PROMPTS,
        "files": FILES,
        "cases": {},
    }
    for kind, layout in CASES:
        with tiny_patches(config):
            if layout == "Q8_0":
                with umt5.gguf_loader(gguf_nodes, umt5_size=False):
                    (clip,) = gguf_nodes.CLIPLoaderGGUF().load_clip(FILES[layout], type=kind)
            else:
                (clip,) = nodes.CLIPLoader().load_clip(FILES[layout], type=kind)
            rows = []
            for prompt in PROMPTS:
                (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
                pooled = cond[0][1].get("pooled_output")
                rows.append(
                    {
                        "cond": tensor_json(cond[0][0][0]),
                        "pooled": None if pooled is None else tensor_json(pooled),
                        "extra": sorted(k for k in cond[0][1] if k != "pooled_output"),
                    }
                )
        reference["cases"][f"{kind}_{layout}"] = {"family": kind, "file": FILES[layout], "conditioning": rows}
        print(kind, layout, [r["cond"]["shape"] for r in rows], [r["extra"] for r in rows])
    (HERE / "comfy_t5xxl_reference.json").write_text(json.dumps(reference) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--gguf-nodes", type=Path, default=Path("/work/shared/ComfyUI-GGUF"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-t5-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
