"""Regenerate the tiny UMT5 text-encoder files (tests/data/tiny_umt5_*) and tests/data/comfy_umt5_reference.json
with ComfyUI's OWN CLIPLoader (type "wan") + CLIPTextEncode.

Run by hand (not in CI) with the Python of ComfyUI's venv (tests/comfyui/comfy_env.py builds it; it has
sentencepiece and gguf) plus protobuf, which ComfyUI-GGUF's tokenizer rebuild imports
(``pip install --target /tmp/pb protobuf``):

    PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_umt5_reference.py \\
        [--comfy /work/shared/ComfyUI] [--gguf-nodes /work/shared/ComfyUI-GGUF]

What it does, all on the CPU:
1. Trains a tiny SentencePiece unigram model (UMT5's special ids: pad 0, end 1, unk 2, no start token) on a few
   sentences, and builds a seeded random UMT5 encoder 32 wide (2 heads of 16, feed-forward 64, 2 blocks, one
   position table per block) under the original checkpoints' names, its vocabulary the tokenizer's.
2. Saves it as ComfyUI's Wan text-encoder files do: bf16 with the tokenizer as the uint8 tensor
   ``spiece_model`` (umt5_xxl_fp16's layout), and "fp8 scaled" (every Linear weight e4m3fn with a float32
   ``scale_weight``, the ``scaled_fp8`` marker; umt5_xxl_fp8_e4m3fn_scaled's layout); and as a llama.cpp GGUF
   (``write_gguf``: umt5-xxl-encoder-Q8_0.gguf's layout, the tokenizer as tokenizer.ggml.* metadata).
3. Loads each with ``nodes.CLIPLoader().load_clip(name, "wan")`` (the GGUF with ComfyUI-GGUF's
   ``CLIPLoaderGGUF``) and encodes the prompts with ``nodes.CLIPTextEncode``; stores each CONDITIONING's shape,
   its token count (ComfyUI's tokens up to the end token) and its rows up to there (the rest is zeros, checked
   here).

Three things are patched, all sizes: ComfyUI recognises UMT5-XXL by a 24th block 4096 wide
(``comfy.sd.detect_te_model``), so the tiny files are reported as T5-XXL; it reads the weight dtype and the
fp8 marker only of a file with a 24th block (``comfy.sd.t5xxl_detect``), so they are read from the tiny file
(by ComfyUI's own ``sd3_clip.t5_xxl_detect``); and Wan's encoder always reads
``umt5_config_xxl.json``, so the tiny sizes are read from a config of the same form instead. ComfyUI-GGUF
rebuilds the tokenizer from the metadata (and dequantises the token embedding to float16) only for a
(256384, 4096) embedding, UMT5-XXL's: the tiny GGUF gets both steps, by ComfyUI-GGUF's own functions; and its
``get_field`` is given a numpy-2 form of its scalar read (``int()`` of a 1-element array is refused there).
Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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
FILES = {
    "bf16": "tiny_umt5_bf16.safetensors",
    "fp8_scaled": "tiny_umt5_fp8_e4m3fn_scaled.safetensors",
    "Q8_0": "tiny_umt5_Q8_0.gguf",
}
PROMPTS = [
    "a red fox in the snow",
    "A lighthouse at dusk, waves crashing against the rocks.",
    "",
    "Zebra crossing   with  double spaces\nand a new line; ünïcödé 漢字",
    "a (red:1.3) fox in the ((snow)), \\(literal\\) parentheses",  # ComfyUI's weight syntax
    "(a lighthouse:0.8) at dusk (unclosed",
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
        vocab_size=320,  # 256 byte pieces + 3 special + the corpus's
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        byte_fallback=True,  # as UMT5's: characters outside the pieces become byte pieces
        normalization_rule_name="identity",  # no NFKC table: keeps the files small (UMT5's own is ~240 KB)
        minloglevel=2,
    )
    return out.getvalue()


def tiny_umt5(vocab: int, table_per_block: bool = True) -> dict[str, torch.Tensor]:
    """Seeded random UMT5 encoder tensors under the original names (float32); ``table_per_block`` False: T5 v1.1's
    single position table, in the first block."""
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
        if table_per_block or i == 0:
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


def write_gguf(tensors: dict[str, torch.Tensor], spiece: bytes | None, path: Path, blocks: int = BLOCKS) -> None:
    """The encoder as llama.cpp's converter + quantiser lay out a T5 encoder (general.architecture "t5encoder"):
    its names from the ``gguf`` package's tensor map, Linear weights and the token embedding Q8_0, norms and
    position tables F32; the tokenizer as tokenizer.ggml.* metadata (pieces, scores, types)."""
    import gguf
    import sentencepiece

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5ENCODER, blocks)
    writer = gguf.GGUFWriter(path=None, arch="t5encoder")
    if spiece is not None:
        add_tokenizer(writer, sentencepiece.SentencePieceProcessor(model_proto=spiece))
    for name, value in tensors.items():
        kind = gguf.GGMLQuantizationType.F32
        if value.ndim == 2 and "relative_attention_bias" not in name:
            kind = gguf.GGMLQuantizationType.Q8_0
        packed = gguf.quants.quantize(value.float().numpy(), kind)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), packed, raw_dtype=kind)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_tokenizer(writer, sp) -> None:
    """A SentencePiece model as llama.cpp's T5 converter stores it: tokenizer.ggml.* metadata."""
    pieces = range(sp.get_piece_size())
    kinds = [
        3 if sp.is_control(i) else 2 if sp.is_unknown(i) else 6 if sp.is_byte(i) else 5 if sp.is_unused(i) else 1
        for i in pieces
    ]
    writer.add_tokenizer_model("t5")
    writer.add_token_list([sp.id_to_piece(i) for i in pieces])
    writer.add_token_scores([sp.get_score(i) for i in pieces])
    writer.add_token_types(kinds)
    writer.add_add_space_prefix(True)
    writer.add_remove_extra_whitespaces(True)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(2)


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


def gguf_loader(gguf_nodes, umt5_size: bool = True):
    """ComfyUI-GGUF's CLIPLoaderGGUF, reading a tiny T5 GGUF the way it reads UMT5-XXL's: its size gate
    (a (256384, 4096) token embedding) rebuilds the tokenizer from the metadata and dequantises the embedding to
    float16; the tiny file gets both, by ComfyUI-GGUF's own functions (``umt5_size`` False: a T5 file, neither)."""
    loader = sys.modules["comfyui_gguf.loader"]
    original = loader.gguf_clip_loader
    read_field = loader.get_field

    def get_field(reader, name, kind):  # numpy 2 refuses int() of the 1-element array its scalars come as
        if kind in (int, float, bool) and reader.get_field(name) is not None:
            field = reader.get_field(name)
            return kind(field.parts[field.data[-1]][0])
        return read_field(reader, name, kind)

    def clip_loader(path):
        sd = original(path)
        if umt5_size and "spiece_model" not in sd:
            sd["spiece_model"] = loader.gguf_tokenizer_loader(path, (256384, 4096))
            sd["shared.weight"] = loader.dequantize_tensor(sd["shared.weight"], dtype=torch.float16)
        return sd

    return _patches(
        mock.patch.object(gguf_nodes, "gguf_clip_loader", clip_loader),
        mock.patch.object(loader, "get_field", get_field),
    )


@contextlib.contextmanager
def _patches(*patches):
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def encode_all(nodes, name: str, config_path: Path, gguf_nodes=None) -> list[torch.Tensor]:
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
        if gguf_nodes is None:
            (clip,) = nodes.CLIPLoader().load_clip(name, type="wan")
        else:
            with gguf_loader(gguf_nodes):
                (clip,) = gguf_nodes.CLIPLoaderGGUF().load_clip(name, type="wan")
    out = []
    for prompt in PROMPTS:
        (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
        assert len(cond) == 1 and cond[0][1].get("pooled_output") is None, cond[0][1].keys()
        ids = [t[0] for t in clip.tokenize(prompt)["umt5xxl"][0]]
        out.append((cond[0][0].float(), ids.index(1) + 1))  # tokens up to the end token
    return out


def run(args, base: Path) -> None:
    from safetensors.torch import save_file

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401 (ComfyUI's package, on sys.path now)

    import nodes

    spec = importlib.util.spec_from_file_location(
        "comfyui_gguf", args.gguf_nodes / "__init__.py", submodule_search_locations=[str(args.gguf_nodes)]
    )
    package = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_gguf"] = package
    spec.loader.exec_module(package)
    gguf_nodes = sys.modules["comfyui_gguf.nodes"]

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
        "command": "PYTHONPATH=/tmp/pb ~/.cache/dit-parallel/comfyui-venv-*/bin/python "
        "tests/data/make_comfy_umt5_reference.py",
        "prompts": PROMPTS,
        "cases": {},
    }
    for case in FILES:
        if case == "Q8_0":
            write_gguf(tensors, spiece, HERE / FILES[case])
        else:
            save_file({k: v.contiguous() for k, v in layouts[case].items()}, str(HERE / FILES[case]))
        shutil.copy(HERE / FILES[case], folder / FILES[case])
        conds = encode_all(nodes, FILES[case], config, gguf_nodes if case == "Q8_0" else None)
        rows = []
        for cond, count in conds:
            assert cond.shape == (1, max(512, count), WIDTH), cond.shape
            assert not cond[:, count:].any(), "ComfyUI zeroes the padding's states"
            rows.append({"shape": list(cond.shape), "tokens": count, "kept": tensor_json(cond[0, :count])})
        reference["cases"][case] = {"file": FILES[case], "conditioning": rows}
        print(case, [count for _, count in conds], [float(c.abs().max()) for c, _ in conds])
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
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    parser.add_argument("--gguf-nodes", type=Path, default=Path("/work/shared/ComfyUI-GGUF"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-umt5-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
