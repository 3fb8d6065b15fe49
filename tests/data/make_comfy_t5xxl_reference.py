"""Regenerate the tiny T5 (v1.1) text-encoder files (tests/data/tiny_t5_*) and tests/data/comfy_t5xxl_reference.json
with ComfyUI's OWN CLIPLoader (types "chroma" and "sd3") + CLIPTextEncode, and ComfyUI-GGUF's CLIPLoaderGGUF; and
the tiny CLIP-L file (tests/data/tiny_clip_l.safetensors) with tests/data/comfy_flux_text_reference.json from
ComfyUI's DualCLIPLoader (type "flux": T5-XXL + CLIP-L; the GGUF T5 through ComfyUI-GGUF's DualCLIPLoaderGGUF).

Run by hand (not in CI), as make_comfy_umt5_reference.py (whose helpers it uses):

    PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_t5xxl_reference.py

What it does, all on the CPU:
1. Builds a seeded random T5 v1.1 encoder (32 wide, 2 heads of 16, feed-forward 64, 2 blocks, ONE position table
   in the first block) under the original names, its vocabulary the tiny T5 tokenizer's
   (tests/data/tiny_t5_tokenizer: tiny-chroma's, a T5 tokenizer of 390 pieces, copied from dit_devtools' tiny
   model), and saves it as t5xxl_fp16's layout (bf16), t5xxl_fp8_e4m3fn_scaled's (Linear weights e4m3fn with
   scale_weight, the scaled_fp8 marker) and t5-v1_1-xxl-encoder-Q8_0.gguf's (llama.cpp's, Q8_0).
2. Loads them with ``CLIPLoader`` types chroma and pixart (all three layouts; the GGUF with ``CLIPLoaderGGUF``) and
   type sd3 (bf16 and the GGUF: T5 alone, no CLIP-L / CLIP-G), encodes the prompts with ``CLIPTextEncode`` and
   stores each CONDITIONING with its pooled output and attention mask (type ltxv, LTX-Video's: the prompt padded to 128
   tokens, the mask in the CONDITIONING) (``--add pixart``: only that family's cases, from the files
   already in tests/data, the other cases kept).
3. Builds a seeded random CLIP-L text tower (128 wide, 2 heads of 64 as CLIP-L's, 2 layers, feed-forward 256,
   77 positions, text_projection) under transformers' ``text_model.*`` names in float16 (clip_l.safetensors'
   layout), its vocabulary the tiny CLIP tokenizer's (tests/data/tiny_clip_tokenizer: tiny-flux's, 714 pieces),
   and stores DualCLIPLoader (type flux) + CLIPTextEncode of each T5 layout with it (``--flux-only``: this step
   alone, with the T5 files already in tests/data).

Patched, all sizes: the T5-XXL detection and the weight-dtype / fp8 read (a 24th block 4096 wide, as in
make_comfy_umt5_reference.py), T5's config (``t5_config_xxl.json`` -> the tiny sizes) and the tokenizer folder
ComfyUI's T5 tokenizers read (``comfy/text_encoders/t5_tokenizer`` -> the tiny one; the full one has 32100
pieces). For the flux cases also: the text-encoder detection (CLIP-L by its ``text_model.`` tensors), CLIP-L's config
(``sd1_clip_config.json`` -> the tiny sizes and the tiny tokenizer's start / end ids, as the model's special
tokens; its token table's 49408 rows -> the tiny vocabulary's) and its tokenizer folder (``comfy/sd1_tokenizer`` -> the tiny one). Nothing from parallel_runtime is
imported.
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
CASES = [
    ("chroma", "bf16"),
    ("chroma", "fp8_scaled"),
    ("chroma", "Q8_0"),
    ("sd3", "bf16"),
    ("sd3", "Q8_0"),
    ("pixart", "bf16"),
    ("pixart", "fp8_scaled"),
    ("pixart", "Q8_0"),
    ("ltxv", "bf16"),
    ("ltxv", "fp8_scaled"),
    ("ltxv", "Q8_0"),
]
PROMPTS = [
    "a red fox in the snow",
    "A lighthouse at dusk, waves crashing against the rocks at night.",
    "",
    "a (red:1.3) fox in the ((snow)), \\(literal\\) parentheses",  # ComfyUI's weight syntax
    "(a lighthouse:0.8) at dusk (unclosed",
]
CLIP_FILE = "tiny_clip_l.safetensors"
CLIP_TOKENIZER = HERE / "tiny_clip_tokenizer"
CLIP_WIDTH, CLIP_HEADS, CLIP_LAYERS, CLIP_FF, CLIP_POSITIONS = 128, 2, 2, 256, 77
FLUX_CASES = {"bf16": None, "fp8_scaled": 1, "Q8_0": 1}  # layout -> how many prompts (None: all; a small file)
FLUX_PROMPTS = PROMPTS + [
    # past CLIP's 77 tokens: a run of text of 8+ tokens is cut at the chunk's end, a shorter one moves whole to
    # the next chunk
    " ".join(["a photo of a cat sitting on a red chair in the garden"] * 7),
    "a photo of " + "cat " * 70 + "qwzxqwzxqwzxqwzx qwzx sunset",
    "a photo of " + "a " * 71 + "(red chair:1.2) in the garden",
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


def tiny_clip_l(vocab: int) -> dict[str, torch.Tensor]:
    """Seeded random CLIP-L text tower tensors under transformers' ``text_model.*`` names (float32)."""
    g = torch.Generator().manual_seed(1)
    w, f = CLIP_WIDTH, CLIP_FF

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    sd = {
        "text_model.embeddings.token_embedding.weight": rand(vocab, w, scale=0.5),
        "text_model.embeddings.position_embedding.weight": rand(CLIP_POSITIONS, w, scale=0.5),
    }
    for i in range(CLIP_LAYERS):
        a = f"text_model.encoder.layers.{i}."
        for p in ("q", "k", "v", "out"):
            sd[f"{a}self_attn.{p}_proj.weight"] = rand(w, w, scale=w**-0.5)
            sd[f"{a}self_attn.{p}_proj.bias"] = rand(w, scale=0.1)
        for n in ("layer_norm1", "layer_norm2"):
            sd[f"{a}{n}.weight"], sd[f"{a}{n}.bias"] = 1 + rand(w, scale=0.1), rand(w, scale=0.1)
        sd[f"{a}mlp.fc1.weight"], sd[f"{a}mlp.fc1.bias"] = rand(f, w, scale=w**-0.5), rand(f, scale=0.1)
        sd[f"{a}mlp.fc2.weight"], sd[f"{a}mlp.fc2.bias"] = rand(w, f, scale=f**-0.5), rand(w, scale=0.1)
    sd["text_model.final_layer_norm.weight"] = 1 + rand(w, scale=0.1)
    sd["text_model.final_layer_norm.bias"] = rand(w, scale=0.1)
    sd["text_projection.weight"] = rand(w, w, scale=w**-0.5)
    return sd


def flux_patches(t5_config: Path, clip_config: Path, start: int, end: int, vocab: int):
    import comfy.clip_model
    import comfy.sd
    import comfy.sd1_clip
    import comfy.text_encoders.sd3_clip

    model_init, tokenizer_init = comfy.sd1_clip.SDClipModel.__init__, comfy.sd1_clip.SDTokenizer.__init__
    embeddings_init = comfy.clip_model.CLIPEmbeddings.__init__

    def embeddings(self, embed_dim, vocab_size=None, *args, **kwargs):  # ComfyUI's CLIP has 49408 rows, always
        return embeddings_init(self, embed_dim, vocab, *args, **kwargs)

    def model(self, *args, textmodel_json_config=None, **kwargs):
        if textmodel_json_config is None:  # CLIP-L: ComfyUI's sd1_clip_config.json and CLIP's special tokens
            textmodel_json_config = str(clip_config)
            kwargs["special_tokens"] = {"start": start, "end": end, "pad": end}
        elif str(textmodel_json_config).endswith("t5_config_xxl.json"):
            textmodel_json_config = str(t5_config)
        return model_init(self, *args, textmodel_json_config=textmodel_json_config, **kwargs)

    def tokenizer(self, tokenizer_path=None, *args, **kwargs):
        if tokenizer_path is None:
            tokenizer_path = str(CLIP_TOKENIZER)
        elif str(tokenizer_path).endswith("t5_tokenizer"):
            tokenizer_path = str(TOKENIZER)
        return tokenizer_init(self, tokenizer_path, *args, **kwargs)

    def detect(sd):
        is_clip = "text_model.encoder.layers.1.mlp.fc1.weight" in sd
        return comfy.sd.TEModel.CLIP_L if is_clip else comfy.sd.TEModel.T5_XXL

    def t5_detect(data):
        t5 = next(sd for sd in data if "encoder.final_layer_norm.weight" in sd)
        return comfy.text_encoders.sd3_clip.t5_xxl_detect(t5)

    return umt5._patches(
        mock.patch.object(comfy.sd, "detect_te_model", detect),
        mock.patch.object(comfy.sd, "t5xxl_detect", t5_detect),
        mock.patch.object(comfy.sd1_clip.SDClipModel, "__init__", model),
        mock.patch.object(comfy.sd1_clip.SDTokenizer, "__init__", tokenizer),
        mock.patch.object(comfy.clip_model.CLIPEmbeddings, "__init__", embeddings),
    )


def run_flux(args, base: Path, nodes, gguf_nodes, t5_config: Path) -> None:
    from safetensors.torch import save_file
    from transformers import CLIPTokenizer

    clip_tokenizer = CLIPTokenizer.from_pretrained(str(CLIP_TOKENIZER))
    start, end = clip_tokenizer("")["input_ids"]
    save_file({k: v.half().contiguous() for k, v in tiny_clip_l(len(clip_tokenizer)).items()}, str(HERE / CLIP_FILE))
    folder = base / "models" / "text_encoders"
    for name in [*FILES.values(), CLIP_FILE]:
        shutil.copy(HERE / name, folder / name)
    clip_config = base / "tiny_clip_l_config.json"
    comfy_clip = json.loads((args.comfy / "comfy" / "sd1_clip_config.json").read_text())
    sizes = {"hidden_size": CLIP_WIDTH, "num_attention_heads": CLIP_HEADS, "num_hidden_layers": CLIP_LAYERS}
    sizes |= {"intermediate_size": CLIP_FF, "projection_dim": CLIP_WIDTH, "vocab_size": len(clip_tokenizer)}
    clip_config.write_text(json.dumps({**comfy_clip, **sizes, "bos_token_id": start, "eos_token_id": end}))
    reference = {
        "comfyui_commit": umt5._git(args.comfy),
        "command": "PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python "
        "tests/data/make_comfy_t5xxl_reference.py",
        "prompts": FLUX_PROMPTS,
        "clip_file": CLIP_FILE,
        "cases": {},
    }
    for layout, count in FLUX_CASES.items():
        with flux_patches(t5_config, clip_config, start, end, len(clip_tokenizer)):
            if layout == "Q8_0":
                with umt5.gguf_loader(gguf_nodes, umt5_size=False):
                    (clip,) = gguf_nodes.DualCLIPLoaderGGUF().load_clip(FILES[layout], CLIP_FILE, type="flux")
            else:
                (clip,) = nodes.DualCLIPLoader().load_clip(FILES[layout], CLIP_FILE, type="flux")
            rows = []
            for prompt in FLUX_PROMPTS[:count]:
                (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
                rows.append(
                    {
                        # T5's states of the long prompts are left out (a smaller file): they test CLIP's chunks
                        "cond": tensor_json(cond[0][0][0]) if prompt in PROMPTS else None,
                        "cond_shape": list(cond[0][0][0].shape),
                        "pooled": tensor_json(cond[0][1]["pooled_output"][0]),
                        "extra": sorted(k for k in cond[0][1] if k != "pooled_output"),
                    }
                )
        reference["cases"][f"flux_{layout}"] = {"family": "flux", "file": FILES[layout], "conditioning": rows}
        print("flux", layout, [r["cond_shape"] for r in rows], [r["extra"] for r in rows])
    (HERE / "comfy_flux_text_reference.json").write_text(json.dumps(reference) + "\n")


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

    config = base / "tiny_t5_config.json"
    config.write_text(json.dumps({**umt5.comfy_config(VOCAB), "model_type": "t5"}))
    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    if args.flux_only:
        run_flux(args, base, nodes, gguf_nodes, config)
        return
    cases = CASES
    if args.add:  # the stored files and cases kept, the named families' cases (re)made from them
        reference = json.loads((HERE / "comfy_t5xxl_reference.json").read_text())
        cases = [(kind, layout) for kind, layout in CASES if kind in args.add]
    else:
        tensors = umt5.tiny_umt5(VOCAB, table_per_block=False)
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(HERE / FILES["bf16"]))
        save_file({k: v.contiguous() for k, v in umt5.scaled_fp8(tensors).items()}, str(HERE / FILES["fp8_scaled"]))
        umt5.write_gguf(tensors, None, HERE / FILES["Q8_0"])
        reference = {
            "comfyui_commit": umt5._git(args.comfy),
            "command": "PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python "
            "tests/data/make_comfy_t5xxl_reference.py",
            "prompts": PROMPTS,
            "files": FILES,
            "cases": {},
        }
    for name in FILES.values():
        shutil.copy(HERE / name, folder / name)
    for kind, layout in cases:
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
                        "attention_mask": (
                            cond[0][1]["attention_mask"].tolist() if "attention_mask" in cond[0][1] else None
                        ),
                    }
                )
        reference["cases"][f"{kind}_{layout}"] = {"family": kind, "file": FILES[layout], "conditioning": rows}
        print(kind, layout, [r["cond"]["shape"] for r in rows], [r["extra"] for r in rows])
    (HERE / "comfy_t5xxl_reference.json").write_text(json.dumps(reference) + "\n")
    if not args.add:
        run_flux(args, base, nodes, gguf_nodes, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--gguf-nodes", type=Path, default=Path("/work/shared/ComfyUI-GGUF"))
    parser.add_argument("--flux-only", action="store_true", help="only the flux (T5-XXL + CLIP-L) cases")
    parser.add_argument(
        "--add",
        nargs="+",
        choices=sorted({kind for kind, _ in CASES}),
        help="only these families' cases, from the stored files",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-t5-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
