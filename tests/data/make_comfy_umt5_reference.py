"""Regenerate the tiny UMT5 text-encoder files (tests/data/tiny_umt5_*) and tests/data/comfy_umt5_reference.json
with ComfyUI's OWN CLIPLoader (type "wan") + CLIPTextEncode.

Run by hand (not in CI) with the Python of ComfyUI's venv (tests/comfyui/comfy_env.py builds it; it has
sentencepiece):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_umt5_reference.py \\
        [--comfy /work/shared/ComfyUI]

What it does, all on the CPU:
1. Trains a tiny SentencePiece unigram model (UMT5's special ids: pad 0, end 1, unk 2, no start token) on a few
   sentences, and builds a seeded random UMT5 encoder 32 wide (2 heads of 16, feed-forward 64, 2 blocks, one
   position table per block) under the original checkpoints' names, its vocabulary the tokenizer's.
2. Saves it as ComfyUI's Wan text-encoder files do: bf16 with the tokenizer as the uint8 tensor
   ``spiece_model`` (umt5_xxl_fp16's layout), and "fp8 scaled" (every Linear weight e4m3fn with a float32
   ``scale_weight``, the ``scaled_fp8`` marker; umt5_xxl_fp8_e4m3fn_scaled's layout).
3. Loads each with ``nodes.CLIPLoader().load_clip(name, "wan")`` and encodes the prompts with
   ``nodes.CLIPTextEncode``; stores each CONDITIONING's shape, its token count and its rows up to there (the
   rest is zeros, checked here).

Three things are patched, all sizes: ComfyUI recognises UMT5-XXL by a 24th block 4096 wide
(``comfy.sd.detect_te_model``), so the tiny files are reported as T5-XXL; it reads the weight dtype and the
fp8 marker only of a file with a 24th block (``comfy.sd.t5xxl_detect``), so they are read from the tiny file
(by ComfyUI's own ``sd3_clip.t5_xxl_detect``); and Wan's encoder always reads
``umt5_config_xxl.json``, so the tiny sizes are read from a config of the same form instead. Nothing from
parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402 (the sibling helper, found through this folder)

SEED = 20251126
WIDTH, HEADS, HEAD_DIM, FF, BLOCKS, BUCKETS = 32, 2, 16, 64, 2, 32
FILES = {"bf16": "tiny_umt5_bf16.safetensors", "fp8_scaled": "tiny_umt5_fp8_e4m3fn_scaled.safetensors"}
PROMPTS = [
    "a red fox in the snow",
    "A lighthouse at dusk, waves crashing against the rocks.",
    "",
    "Zebra crossing   with  double spaces\nand a new line; ünïcödé 漢字",
]
CORPUS = [
    "a red fox runs in the white snow at dawn",
    "a lighthouse stands at dusk while the waves crash against the dark rocks",
    "the zebra crossing is empty, and the city sleeps",
    "cats and dogs play in the garden with a ball",
    "an old man reads a book by the window in the rain",
] * 4
FP8_MAX = 448.0


def train_tokenizer() -> bytes:
    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS),
        model_writer=out,
        vocab_size=96,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        normalization_rule_name="identity",  # no NFKC table: keeps the files small (UMT5's own is ~240 KB)
        minloglevel=2,
    )
    return out.getvalue()


def tiny_umt5(vocab: int) -> dict[str, torch.Tensor]:
    """Seeded random UMT5 encoder tensors under the original names (float32)."""
    g = torch.Generator().manual_seed(SEED)
    inner = HEADS * HEAD_DIM

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    sd = {"shared.weight": rand(vocab, WIDTH)}
    for i in range(BLOCKS):
        a, f = f"encoder.block.{i}.layer.0.", f"encoder.block.{i}.layer.1."
        for p in "qkv":
            sd[f"{a}SelfAttention.{p}.weight"] = rand(inner, WIDTH, scale=WIDTH**-0.5)
        sd[f"{a}SelfAttention.o.weight"] = rand(WIDTH, inner, scale=inner**-0.5)
        sd[f"{a}SelfAttention.relative_attention_bias.weight"] = rand(BUCKETS, HEADS)
        sd[f"{a}layer_norm.weight"] = 1 + rand(WIDTH, scale=0.1)
        sd[f"{f}DenseReluDense.wi_0.weight"] = rand(FF, WIDTH, scale=WIDTH**-0.5)
        sd[f"{f}DenseReluDense.wi_1.weight"] = rand(FF, WIDTH, scale=WIDTH**-0.5)
        sd[f"{f}DenseReluDense.wo.weight"] = rand(WIDTH, FF, scale=FF**-0.5)
        sd[f"{f}layer_norm.weight"] = 1 + rand(WIDTH, scale=0.1)
    sd["encoder.final_layer_norm.weight"] = 1 + rand(WIDTH, scale=0.1)
    return sd


def scaled_fp8(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ComfyUI's "fp8 scaled" layout: Linear weights e4m3fn / a float32 scale each, the rest bf16."""
    out = {}
    for k, v in sd.items():
        linear = v.ndim == 2 and (".SelfAttention." in k or ".DenseReluDense." in k) and "_bias" not in k
        if linear:
            scale = v.abs().max() / FP8_MAX
            out[k] = (v / scale).to(torch.float8_e4m3fn)
            out[k[: -len("weight")] + "scale_weight"] = scale.reshape(()).float()
        else:
            out[k] = v.to(torch.bfloat16)
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def comfy_config(vocab: int) -> dict:
    return {
        "d_ff": FF,
        "d_kv": HEAD_DIM,
        "d_model": WIDTH,
        "dense_act_fn": "gelu_pytorch_tanh",
        "is_gated_act": True,
        "layer_norm_epsilon": 1e-06,
        "model_type": "umt5",
        "num_heads": HEADS,
        "num_layers": BLOCKS,
        "relative_attention_num_buckets": BUCKETS,
        "vocab_size": vocab,
    }


def encode_all(nodes, name: str, config_path: Path) -> list[torch.Tensor]:
    import comfy.sd
    import comfy.sd1_clip

    original_init = comfy.sd1_clip.SDClipModel.__init__

    def tiny_init(self, *args, textmodel_json_config=None, **kwargs):
        if textmodel_json_config and str(textmodel_json_config).endswith("umt5_config_xxl.json"):
            textmodel_json_config = str(config_path)
        return original_init(self, *args, textmodel_json_config=textmodel_json_config, **kwargs)

    import comfy.text_encoders.sd3_clip

    with (
        mock.patch.object(comfy.sd, "detect_te_model", lambda sd: comfy.sd.TEModel.T5_XXL),
        mock.patch.object(comfy.sd, "t5xxl_detect", lambda data: comfy.text_encoders.sd3_clip.t5_xxl_detect(data[0])),
        mock.patch.object(comfy.sd1_clip.SDClipModel, "__init__", tiny_init),
    ):
        (clip,) = nodes.CLIPLoader().load_clip(name, type="wan")
    out = []
    for prompt in PROMPTS:
        (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
        assert len(cond) == 1 and cond[0][1].get("pooled_output") is None, cond[0][1].keys()
        out.append(cond[0][0].float())
    return out


def run(args, base: Path) -> None:
    from safetensors.torch import save_file

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401 (ComfyUI's package, on sys.path now)

    import nodes

    spiece = train_tokenizer()
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=spiece)
    vocab = processor.get_piece_size()
    tensors = tiny_umt5(vocab)
    tokenizer = torch.tensor(list(spiece), dtype=torch.uint8)
    layouts = {
        "bf16": {**{k: v.to(torch.bfloat16) for k, v in tensors.items()}, "spiece_model": tokenizer},
        "fp8_scaled": {**scaled_fp8(tensors), "spiece_model": tokenizer},
    }
    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    config = base / "tiny_umt5_config.json"
    config.write_text(json.dumps(comfy_config(vocab)))
    reference = {
        "comfyui_commit": _git(args.comfy),
        "command": "~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_umt5_reference.py",
        "prompts": PROMPTS,
        "tokens": [len(processor.encode(p)) + 1 for p in PROMPTS],
        "cases": {},
    }
    for case, state in layouts.items():
        save_file({k: v.contiguous() for k, v in state.items()}, str(HERE / FILES[case]))
        shutil.copy(HERE / FILES[case], folder / FILES[case])
        conds = encode_all(nodes, FILES[case], config)
        rows = []
        for cond, count in zip(conds, reference["tokens"]):
            assert cond.shape == (1, max(512, count), WIDTH), cond.shape
            assert not cond[:, count:].any(), "ComfyUI zeroes the padding's states"
            rows.append({"shape": list(cond.shape), "kept": tensor_json(cond[0, :count])})
        reference["cases"][case] = {"file": FILES[case], "conditioning": rows}
        print(case, [c.shape for c in conds], [float(c.abs().max()) for c in conds])
    (HERE / "comfy_umt5_reference.json").write_text(json.dumps(reference, indent=1) + "\n")


def _git(folder: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=HERE.parents[2] / "shared" / "ComfyUI")
    args = parser.parse_args()
    if not args.comfy.is_dir():
        args.comfy = Path("/work/shared/ComfyUI")
    base = Path(tempfile.mkdtemp(prefix="comfy-umt5-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
