"""Regenerate the tiny HiDream text-encoder files (tests/data/tiny_hidream_{llama_bf16,llama_fp8_e4m3fn_scaled,
clip_l,clip_g}.safetensors) and tests/data/comfy_hidream_text_reference.json with ComfyUI's OWN QuadrupleCLIPLoader
+ CLIPTextEncode (its HiDream text encoder: CLIP-L, CLIP-G, T5-XXL, Llama-3.1 with every layer's states).

Run by hand (not in CI), with the Python that imports ComfyUI:

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python \\
        tests/data/make_comfy_hidream_text_reference.py --comfy /work/shared/ComfyUI

What it does, all on the CPU:
1. Builds seeded random tiny encoders under the names ComfyUI's files use and saves them: Llama (Hugging Face's
   names under ``model.``; 24 wide, 4 layers, ONE head of 128 (ComfyUI's Llama has 128-wide heads, always),
   one key/value head, feed-forward 48; its vocabulary the tiny Llama tokenizer's) in bf16 and in the fp8-scaled
   layout (Linear weights e4m3fn with ``scale_weight``, the ``scaled_fp8`` marker); CLIP-L (64 wide, 1 head,
   2 layers) and CLIP-G (128 wide, 2 heads, 3 layers) in float16 with a square ``text_projection.weight`` (ComfyUI's
   CLIP projects to its own width), their vocabulary the tiny CLIP tokenizer's. T5 is tests/data/tiny_t5_bf16 /
   tiny_t5_fp8_e4m3fn_scaled (make_comfy_t5xxl_reference.py's, 32 wide). T5 32 / Llama 24 are tiny-hidream's text
   widths; its pooled width is 64 + 128 = 192 in the sampler test's variant.
2. Loads the four files with ``QuadrupleCLIPLoader`` (case bf16: bf16 Llama + bf16 T5; case fp8_scaled: both
   fp8-scaled) and stores ``CLIPTextEncode``'s CONDITIONING of each prompt: T5's states, ``pooled_output`` and
   ``conditioning_llama3`` [1, 4, tokens, 24].

Patched, all sizes: the text-encoder detection (``detect_te_model``: Llama by ``model.layers``, T5 by ``encoder.``,
the narrower CLIP is CLIP-L; ComfyUI tells them by their real depths) and ``HiDreamTEModel.load_sd``'s dispatch (the
same rule); ``t5xxl_detect`` (T5's 24th block); the configs ComfyUI builds the encoders from (CLIP-L's
``sd1_clip_config.json``, CLIP-G's ``clip_config_bigg.json``, T5's ``t5_config_xxl.json``, Llama's sizes) -> the
tiny ones, with the tiny tokenizers' special ids (CLIP start / end; Llama's <|begin_of_text|> and <|eot_id|> as
ComfyUI's 128000 / 128009, its pad); CLIP's 49408-row token table -> the tiny vocabulary; the tokenizer folders
(``sd1_tokenizer``, ``t5_tokenizer``, and ``llama_tokenizer`` whose tokenizer.json the snapshot lacks) -> the tiny
ones. ComfyUI reads its Llama tokenizer with ``LlamaTokenizerFast``, which in transformers 5 re-derives a
tokenizer of its own from a byte-level BPE file; the tiny one is read with ``AutoTokenizer`` here, as
Parallel Text Encode reads a tokenizer folder, so both sides see the same token ids and what is compared is
ComfyUI's token layout (start, weights, padding, mask), its encoders and its outputs. Nothing from
parallel_runtime is imported. The tiny Llama tokenizer (tests/data/tiny_llama_tokenizer) is tiny-hunyuan-video's,
saved with ``dit_devtools.tiny.hunyuan_video.build_llama_tokenizer().save_pretrained(...)``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_comfy_umt5_reference as umt5  # noqa: E402 (tiny-file helpers: fp8 layout, patches, git)
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402

LLAMA_TOKENIZER = HERE / "tiny_llama_tokenizer"
CLIP_TOKENIZER = HERE / "tiny_clip_tokenizer"
T5_TOKENIZER = HERE / "tiny_t5_tokenizer"
T5_VOCAB = 400  # make_comfy_t5xxl_reference.VOCAB
LLAMA = dict(hidden=24, layers=4, heads=1, kv_heads=1, ff=48, vocab=576)
CLIPS = {  # kind -> (width, heads, layers, feed-forward, projection: square, as ComfyUI builds it)
    "clip_l": (64, 1, 2, 128, 64),
    "clip_g": (128, 2, 3, 256, 128),  # 3 layers: ComfyUI reads its penultimate one
}
FILES = {
    "llama_bf16": "tiny_hidream_llama_bf16.safetensors",
    "llama_fp8_scaled": "tiny_hidream_llama_fp8_e4m3fn_scaled.safetensors",
    "clip_l": "tiny_hidream_clip_l.safetensors",
    "clip_g": "tiny_hidream_clip_g.safetensors",
    "t5_bf16": "tiny_t5_bf16.safetensors",
    "t5_fp8_scaled": "tiny_t5_fp8_e4m3fn_scaled.safetensors",
}
CASES = {"bf16": None, "fp8_scaled": 2}  # layout -> how many prompts (None: all)
PROMPTS = [
    "a red fox in the snow",
    "",
    "a (red:1.3) fox in the ((snow)), \\(literal\\) parentheses",  # weights: T5's tokens, Llama's layers
    "(a lighthouse:0.8) at dusk (unclosed",
    # past T5's 128-token chunk: a run of 8+ tokens is cut at the chunk's end; Llama keeps every token
    " ".join(["a photo of a cat sitting on a red chair in the garden"] * 14),
    "a photo of " + "cat " * 123 + "(qwzxqwzxqwzx qwzx:1.1) sunset",
]


def _rand(g: torch.Generator, *shape, scale=1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def tiny_llama() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    w, f, q, kv = LLAMA["hidden"], LLAMA["ff"], 128 * LLAMA["heads"], 128 * LLAMA["kv_heads"]
    sd = {"model.embed_tokens.weight": _rand(g, LLAMA["vocab"], w)}
    for i in range(LLAMA["layers"]):
        a = f"model.layers.{i}."
        sd[a + "input_layernorm.weight"] = 1 + _rand(g, w, scale=0.1)
        sd[a + "post_attention_layernorm.weight"] = 1 + _rand(g, w, scale=0.1)
        sd[a + "self_attn.q_proj.weight"] = _rand(g, q, w, scale=w**-0.5)
        sd[a + "self_attn.k_proj.weight"] = _rand(g, kv, w, scale=w**-0.5)
        sd[a + "self_attn.v_proj.weight"] = _rand(g, kv, w, scale=w**-0.5)
        sd[a + "self_attn.o_proj.weight"] = _rand(g, w, q, scale=q**-0.5)
        sd[a + "mlp.gate_proj.weight"] = _rand(g, f, w, scale=w**-0.5)
        sd[a + "mlp.up_proj.weight"] = _rand(g, f, w, scale=w**-0.5)
        sd[a + "mlp.down_proj.weight"] = _rand(g, w, f, scale=f**-0.5)
    sd["model.norm.weight"] = 1 + _rand(g, w, scale=0.1)
    return sd


def llama_fp8_scaled(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ComfyUI's "fp8 scaled" layout of the Llama: Linear weights e4m3fn with a float32 scale each, the rest bf16."""
    out = {}
    for k, v in sd.items():
        if v.ndim == 2 and (".self_attn." in k or ".mlp." in k):
            scale = v.abs().max() / umt5.FP8_MAX
            out[k] = (v / scale).to(torch.float8_e4m3fn)
            out[k[: -len("weight")] + "scale_weight"] = scale.reshape(()).float()
        else:
            out[k] = v.to(torch.bfloat16)
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def tiny_clip(kind: str, vocab: int) -> dict[str, torch.Tensor]:
    width, _, layers, ff, projection = CLIPS[kind]
    g = torch.Generator().manual_seed(7 if kind == "clip_l" else 8)
    sd = {
        "text_model.embeddings.token_embedding.weight": _rand(g, vocab, width, scale=0.5),
        "text_model.embeddings.position_embedding.weight": _rand(g, 77, width, scale=0.5),
    }
    for i in range(layers):
        a = f"text_model.encoder.layers.{i}."
        for p in ("q", "k", "v", "out"):
            sd[f"{a}self_attn.{p}_proj.weight"] = _rand(g, width, width, scale=width**-0.5)
            sd[f"{a}self_attn.{p}_proj.bias"] = _rand(g, width, scale=0.1)
        for n in ("layer_norm1", "layer_norm2"):
            sd[f"{a}{n}.weight"], sd[f"{a}{n}.bias"] = 1 + _rand(g, width, scale=0.1), _rand(g, width, scale=0.1)
        sd[f"{a}mlp.fc1.weight"], sd[f"{a}mlp.fc1.bias"] = _rand(g, ff, width, scale=width**-0.5), _rand(g, ff)
        sd[f"{a}mlp.fc2.weight"], sd[f"{a}mlp.fc2.bias"] = _rand(g, width, ff, scale=ff**-0.5), _rand(g, width)
    sd["text_model.final_layer_norm.weight"] = 1 + _rand(g, width, scale=0.1)
    sd["text_model.final_layer_norm.bias"] = _rand(g, width, scale=0.1)
    sd["text_projection.weight"] = _rand(g, projection, width, scale=width**-0.5)
    return sd


def _kind(sd) -> str:
    if "model.embed_tokens.weight" in sd:
        return "llama"
    if "encoder.final_layer_norm.weight" in sd:
        return "t5"
    width = sd["text_model.embeddings.token_embedding.weight"].shape[1]
    return "clip_l" if width == CLIPS["clip_l"][0] else "clip_g"


def patches(base: Path, clip_tokenizer, llama_tokenizer):
    import comfy.clip_model
    import comfy.sd
    import comfy.sd1_clip
    import comfy.text_encoders.hidream
    import comfy.text_encoders.sd3_clip
    from transformers import AutoTokenizer

    start, end = clip_tokenizer("")["input_ids"]
    bos, eot = llama_tokenizer.bos_token_id, llama_tokenizer.convert_tokens_to_ids("<|eot_id|>")
    comfy_dir = Path(comfy.sd.__file__).parent
    configs = {}
    for kind, name in (("clip_l", "sd1_clip_config.json"), ("clip_g", "clip_config_bigg.json")):
        width, heads, layers, ff, projection = CLIPS[kind]
        config = json.loads((comfy_dir / name).read_text())
        config |= {"hidden_size": width, "num_attention_heads": heads, "num_hidden_layers": layers}
        config |= {"intermediate_size": ff, "projection_dim": projection, "vocab_size": len(clip_tokenizer)}
        config |= {"bos_token_id": start, "eos_token_id": end}
        configs[kind] = base / f"tiny_{kind}_config.json"
        configs[kind].write_text(json.dumps(config))
    configs["t5"] = base / "tiny_t5_config.json"
    configs["t5"].write_text(json.dumps({**umt5.comfy_config(T5_VOCAB), "model_type": "t5"}))
    llama_config = {
        "vocab_size": LLAMA["vocab"],
        "hidden_size": LLAMA["hidden"],
        "intermediate_size": LLAMA["ff"],
        "num_hidden_layers": LLAMA["layers"],
        "num_attention_heads": LLAMA["heads"],
        "num_key_value_heads": LLAMA["kv_heads"],
    }

    model_init, tokenizer_init = comfy.sd1_clip.SDClipModel.__init__, comfy.sd1_clip.SDTokenizer.__init__
    embeddings_init = comfy.clip_model.CLIPEmbeddings.__init__

    def embeddings(self, embed_dim, vocab_size=None, *args, **kwargs):  # ComfyUI's CLIP has 49408 rows, always
        return embeddings_init(self, embed_dim, len(clip_tokenizer), *args, **kwargs)

    def model(self, *args, textmodel_json_config=None, **kwargs):
        name = str(textmodel_json_config)
        if textmodel_json_config is None:  # CLIP-L: sd1_clip_config.json
            textmodel_json_config = str(configs["clip_l"])
            kwargs["special_tokens"] = {"start": start, "end": end, "pad": end}
        elif name.endswith("clip_config_bigg.json"):
            textmodel_json_config = str(configs["clip_g"])
            kwargs["special_tokens"] = {"start": start, "end": end, "pad": 0}
        elif name.endswith("t5_config_xxl.json"):
            textmodel_json_config = str(configs["t5"])
        elif isinstance(textmodel_json_config, dict):  # the Llama: a dict of sizes
            textmodel_json_config = {**textmodel_json_config, **llama_config}
            kwargs["special_tokens"] = {"start": bos, "pad": eot}
        return model_init(self, *args, textmodel_json_config=textmodel_json_config, **kwargs)

    def tokenizer(self, tokenizer_path=None, *args, **kwargs):
        if tokenizer_path is None:
            tokenizer_path = str(CLIP_TOKENIZER)
        elif str(tokenizer_path).endswith("t5_tokenizer"):
            tokenizer_path = str(T5_TOKENIZER)
        elif str(tokenizer_path).endswith("llama_tokenizer"):
            tokenizer_path = str(LLAMA_TOKENIZER)
            kwargs["pad_token"] = eot
            kwargs["tokenizer_class"] = AutoTokenizer
        return tokenizer_init(self, tokenizer_path, *args, **kwargs)

    def detect(sd):
        return {
            "llama": comfy.sd.TEModel.LLAMA3_8,
            "t5": comfy.sd.TEModel.T5_XXL,
            "clip_l": comfy.sd.TEModel.CLIP_L,
            "clip_g": comfy.sd.TEModel.CLIP_G,
        }[_kind(sd)]

    def t5_detect(data):
        t5 = next(sd for sd in data if "encoder.final_layer_norm.weight" in sd)
        return comfy.text_encoders.sd3_clip.t5_xxl_detect(t5)

    def load_sd(self, sd):
        kind = _kind(sd)
        return getattr(self, {"llama": "llama", "t5": "t5xxl", "clip_l": "clip_l", "clip_g": "clip_g"}[kind]).load_sd(
            sd
        )

    return umt5._patches(
        mock.patch.object(comfy.sd, "detect_te_model", detect),
        mock.patch.object(comfy.sd, "t5xxl_detect", t5_detect),
        mock.patch.object(comfy.text_encoders.hidream.HiDreamTEModel, "load_sd", load_sd),
        mock.patch.object(comfy.sd1_clip.SDClipModel, "__init__", model),
        mock.patch.object(comfy.sd1_clip.SDTokenizer, "__init__", tokenizer),
        mock.patch.object(comfy.clip_model.CLIPEmbeddings, "__init__", embeddings),
    )


def run(args, base: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, CLIPTokenizer

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401
    from comfy_extras.nodes_hidream import QuadrupleCLIPLoader

    import nodes

    clip_tokenizer = CLIPTokenizer.from_pretrained(str(CLIP_TOKENIZER))
    llama_tokenizer = AutoTokenizer.from_pretrained(str(LLAMA_TOKENIZER))
    llama = tiny_llama()
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in llama.items()}, str(HERE / FILES["llama_bf16"]))
    save_file({k: v.contiguous() for k, v in llama_fp8_scaled(llama).items()}, str(HERE / FILES["llama_fp8_scaled"]))
    for kind in CLIPS:
        tensors = tiny_clip(kind, len(clip_tokenizer))
        save_file({k: v.half().contiguous() for k, v in tensors.items()}, str(HERE / FILES[kind]))
    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES.values():
        shutil.copy(HERE / name, folder / name)
    reference = {
        "comfyui_commit": umt5._git(args.comfy),
        "command": "PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-<hash>/bin/python "
        "tests/data/make_comfy_hidream_text_reference.py --comfy /work/shared/ComfyUI",
        "prompts": PROMPTS,
        "files": FILES,
        "cases": {},
    }
    for layout, count in CASES.items():
        names = [FILES[f"t5_{layout}"], FILES["clip_g"], FILES[f"llama_{layout}"], FILES["clip_l"]]
        with patches(base, clip_tokenizer, llama_tokenizer):
            clip = QuadrupleCLIPLoader.execute(*names).result[0]
            rows = []
            for prompt in PROMPTS[:count]:
                (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
                options = cond[0][1]
                rows.append(
                    {
                        "cond": tensor_json(cond[0][0][0]),
                        "pooled": tensor_json(options["pooled_output"][0]),
                        "llama3": tensor_json(options["conditioning_llama3"][0]),
                        "extra": sorted(k for k in options if k != "pooled_output"),
                    }
                )
        reference["cases"][layout] = {"files": names, "conditioning": rows}
        print(layout, [(r["cond"]["shape"], r["llama3"]["shape"]) for r in rows], rows[0]["extra"])
    (HERE / "comfy_hidream_text_reference.json").write_text(json.dumps(reference) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-hidream-text-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
