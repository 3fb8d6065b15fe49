"""A tiny seeded Llama-3 text model and tokenizer, as HunyuanVideo 1.0 users keep its text encoder in
models/text_encoders: ComfyUI's ``llava_llama3_fp16.safetensors`` layout (Hugging Face's names under ``model.``,
float16), its ``llava_llama3_fp8_scaled.safetensors`` layout (every Linear weight e4m3fn with a float32
``scale_weight``, the ``scaled_fp8`` marker), and a tokenizer folder in the form of ComfyUI's ``llama_tokenizer``.

Shared by tests/data/make_comfy_hunyuan_video_text_reference.py (ComfyUI's venv) and the test that checks against
its output; imports nothing from parallel_runtime. The weights are made again from the seed (the embedding alone
has Llama-3's 128,320 rows), and their digests are stored with the reference.

The tokenizer (``write_tokenizer``, stored in tests/data/tiny_llama3_tokenizer) is a byte-level BPE trained on a few
sentences whose ids are Llama-3's where ComfyUI looks for them: <|begin_of_text|> 128000, <|start_header_id|>
128006, <|end_header_id|> 128007, <|eot_id|> 128009, "user" 882, "\\n\\n" 271 (ComfyUI finds the prompt inside
HunyuanVideo's template by these ids; ComfyUI 0.3.64's snapshot lacks its own Llama tokenizer file). The model is
small: 32 wide, 4 query and 2 key/value heads of 8, feed-forward 64, 4 layers (the encoder reads the third-last).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

SEED = 20251128
VOCAB, WIDTH, HEADS, KV_HEADS, HEAD_DIM, FF, LAYERS = 128320, 32, 4, 2, 8, 64, 4
FILES = {"fp16": "tiny_llava_llama3_fp16.safetensors", "fp8_scaled": "tiny_llava_llama3_fp8_scaled.safetensors"}
TOKENIZER = Path(__file__).resolve().parent / "tiny_llama3_tokenizer"
SPECIALS = {
    "<|begin_of_text|>": 128000,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eot_id|>": 128009,
    "<image>": 128257,  # where ComfyUI's TextEncodeHunyuanVideo_ImageToVideo puts the image's vision tokens
}
FIXED = {"user": 882, "\u010a\u010a": 271}  # byte-level BPE spellings: "user", "\n\n"
CORPUS = """Describe the video by detailing the following aspects: 1. The main content and theme of the video.
2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.
3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.
4. background environment, light, style and atmosphere.
5. camera angles, movements, and transitions used in the video:
system

user

a red fox in the snow, a lighthouse at dusk, waves crashing against the rocks at night.
A cat sitting on a chair in the garden, a photo of a dog running on the beach at sunset.
"""


# Llama-3's pre-tokenizer split (its tokenizer.json's), before the byte-level mapping
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(SPLIT), behavior="isolated")
    return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def write_tokenizer(folder: Path = TOKENIZER) -> Path:
    """Train the tiny byte-level BPE and save it (tokenizer.json + tokenizer_config.json) in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    trained.train_from_iterator([CORPUS] * 4, trainer)
    model = json.loads(trained.to_str())["model"]
    assert all(token in model["vocab"] for token in FIXED), "the corpus must make 'user' and '\\n\\n' tokens"
    free = (i for i in range(len(model["vocab"]) + len(FIXED)) if i not in FIXED.values())
    vocab = {t: FIXED[t] if t in FIXED else next(free) for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])}
    vocab.update(SPECIALS)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, SPECIALS[bos])]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": "<|eot_id|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return folder


def tiny_tensors() -> dict[str, torch.Tensor]:
    """Seeded random weights under ComfyUI's names (float32)."""
    g = torch.Generator().manual_seed(SEED)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    sd = {"model.embed_tokens.weight": rand(VOCAB, WIDTH)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + rand(WIDTH, scale=0.1)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            sd[f"{p}self_attn.{name}.weight"] = rand(rows, WIDTH, scale=WIDTH**-0.5)
        sd[p + "self_attn.o_proj.weight"] = rand(WIDTH, q, scale=q**-0.5)
        sd[p + "post_attention_layernorm.weight"] = 1 + rand(WIDTH, scale=0.1)
        sd[p + "mlp.gate_proj.weight"] = rand(FF, WIDTH, scale=WIDTH**-0.5)
        sd[p + "mlp.up_proj.weight"] = rand(FF, WIDTH, scale=WIDTH**-0.5)
        sd[p + "mlp.down_proj.weight"] = rand(WIDTH, FF, scale=FF**-0.5)
    sd["model.norm.weight"] = 1 + rand(WIDTH, scale=0.1)
    return sd


def scaled_fp8(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The "fp8 scaled" layout: each Linear weight as e4m3fn over its float32 ``scale_weight`` (absmax / 448), the
    rest float16, and the ``scaled_fp8`` marker."""
    out = {}
    for name, value in tensors.items():
        if name.endswith("_proj.weight"):
            scale = value.abs().amax() / 448.0
            out[name] = (value / scale).to(torch.float8_e4m3fn)
            out[name[: -len("weight")] + "scale_weight"] = scale.reshape(1).float()
        else:
            out[name] = value.half()
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def write(case: str, folder: Path) -> Path:
    """The ``case`` file ("fp16" or "fp8_scaled") in ``folder``."""
    from safetensors.torch import save_file

    tensors = tiny_tensors()
    tensors = scaled_fp8(tensors) if case == "fp8_scaled" else {k: v.half() for k, v in tensors.items()}
    path = folder / FILES[case]
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    print(write_tokenizer())
