"""Regenerate tests/data/comfy_hunyuan_video_text_reference.json with ComfyUI's OWN DualCLIPLoader (type
"hunyuan_video": CLIP-L + LLaVA-Llama-3) + CLIPTextEncode, from the tiny Llama-3 files of tiny_llava_llama3.py
(fp16 and fp8 scaled) and the tiny CLIP-L file tests/data/tiny_clip_l.safetensors.

Run by hand (not in CI) with the Python of ComfyUI's venv (tests/comfyui/comfy_env.py builds it):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_hunyuan_video_text_reference.py \\
        [--comfy /work/shared/ComfyUI]

What it does, all on the CPU: writes the two Llama files (their sha256 is stored, so the test knows it remade the
same files), loads each with the CLIP-L file through ``nodes.DualCLIPLoader`` (type hunyuan_video; ComfyUI
recognises both files by their own names) and encodes the prompts with ``nodes.CLIPTextEncode``: ComfyUI puts each
prompt into HunyuanVideo's template, tokenizes it, runs Llama, keeps the third-last layer's states of the prompt's
part of the template and CLIP-L's pooled output. Stores each CONDITIONING, its pooled output and whether an
attention mask came with it.

Patched, all sizes: ComfyUI builds its Llama from fixed sizes (``comfy.text_encoders.llama.Llama2Config``: 4096
wide, 32 layers, heads 128 wide), so the tiny sizes are given to it; CLIP-L's config and tokenizer as in
make_comfy_t5xxl_reference.py (its ``tiny_clip_l.safetensors`` and ``tiny_clip_tokenizer``). The Llama tokenizer
ComfyUI reads (``comfy/text_encoders/llama_tokenizer``, missing in the snapshot) is the tiny one
(tests/data/tiny_llama3_tokenizer, Llama-3's ids for the tokens ComfyUI looks for), read as the tokenizer.json it
is (``PreTrainedTokenizerFast``: what ``LlamaTokenizerFast`` did up to transformers 4; transformers 5's
``LlamaTokenizer`` rebuilds a SentencePiece-style pipeline from the file's vocabulary, which is not Llama-3's
tokenizer: it drops the "\\n\\n" token the template crop looks for). Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_comfy_t5xxl_reference as t5ref  # noqa: E402 (siblings: CLIP-L's tiny sizes)
import make_comfy_umt5_reference as umt5  # noqa: E402
import tiny_llava_llama3 as tiny  # noqa: E402
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402

PROMPTS = [
    "a red fox in the snow",
    "A lighthouse at dusk, waves crashing against the rocks at night.",
    "",
    "a (red:1.3) fox in the ((snow)), \\(literal\\) parentheses",  # ComfyUI's weight syntax
    "a photo of " + "cat " * 80 + "at sunset",  # past CLIP's 77 tokens
]


def patches(clip_config: Path, start: int, end: int, vocab: int):
    import comfy.clip_model
    import comfy.sd1_clip
    import comfy.text_encoders.llama
    from transformers import PreTrainedTokenizerFast

    base = comfy.text_encoders.llama.Llama2Config

    @dataclasses.dataclass
    class TinyLlama(base):
        vocab_size: int = tiny.VOCAB
        hidden_size: int = tiny.WIDTH
        intermediate_size: int = tiny.FF
        num_hidden_layers: int = tiny.LAYERS
        num_attention_heads: int = tiny.HEADS
        num_key_value_heads: int = tiny.KV_HEADS
        head_dim = tiny.HEAD_DIM

    model_init, tokenizer_init = comfy.sd1_clip.SDClipModel.__init__, comfy.sd1_clip.SDTokenizer.__init__
    embeddings_init = comfy.clip_model.CLIPEmbeddings.__init__

    def embeddings(self, embed_dim, vocab_size=None, *args, **kwargs):  # ComfyUI's CLIP has 49408 rows, always
        return embeddings_init(self, embed_dim, vocab, *args, **kwargs)

    def model(self, *args, textmodel_json_config=None, **kwargs):
        if textmodel_json_config is None:  # CLIP-L: ComfyUI's sd1_clip_config.json and CLIP's special tokens
            textmodel_json_config = str(clip_config)
            kwargs["special_tokens"] = {"start": start, "end": end, "pad": end}
        return model_init(self, *args, textmodel_json_config=textmodel_json_config, **kwargs)

    def tokenizer(self, tokenizer_path=None, *args, **kwargs):
        if tokenizer_path is None:
            tokenizer_path = str(t5ref.CLIP_TOKENIZER)
        elif str(tokenizer_path).endswith("llama_tokenizer"):
            tokenizer_path = str(tiny.TOKENIZER)
            kwargs["tokenizer_class"] = PreTrainedTokenizerFast
        return tokenizer_init(self, tokenizer_path, *args, **kwargs)

    return umt5._patches(
        mock.patch.object(comfy.text_encoders.llama, "Llama2Config", TinyLlama),
        mock.patch.object(comfy.sd1_clip.SDClipModel, "__init__", model),
        mock.patch.object(comfy.sd1_clip.SDTokenizer, "__init__", tokenizer),
        mock.patch.object(comfy.clip_model.CLIPEmbeddings, "__init__", embeddings),
    )


def run(args, base: Path) -> None:
    from transformers import CLIPTokenizer

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401

    import nodes

    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / t5ref.CLIP_FILE, folder / t5ref.CLIP_FILE)
    clip_tokenizer = CLIPTokenizer.from_pretrained(str(t5ref.CLIP_TOKENIZER))
    start, end = clip_tokenizer("")["input_ids"]
    clip_config = base / "tiny_clip_l_config.json"
    comfy_clip = json.loads((args.comfy / "comfy" / "sd1_clip_config.json").read_text())
    sizes = {"hidden_size": t5ref.CLIP_WIDTH, "num_attention_heads": t5ref.CLIP_HEADS}
    sizes |= {"num_hidden_layers": t5ref.CLIP_LAYERS, "intermediate_size": t5ref.CLIP_FF}
    sizes |= {"projection_dim": t5ref.CLIP_WIDTH, "vocab_size": len(clip_tokenizer)}
    clip_config.write_text(json.dumps({**comfy_clip, **sizes, "bos_token_id": start, "eos_token_id": end}))
    reference = {
        "comfyui_commit": umt5._git(args.comfy),
        "command": "~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_hunyuan_video_text_reference.py",
        "prompts": PROMPTS,
        "clip_file": t5ref.CLIP_FILE,
        "head_dim": tiny.HEAD_DIM,
        "cases": {},
    }
    for case in tiny.FILES:
        path = tiny.write(case, folder)
        rows = []
        with patches(clip_config, start, end, len(clip_tokenizer)):
            (clip,) = nodes.DualCLIPLoader().load_clip(t5ref.CLIP_FILE, path.name, type="hunyuan_video")
            for prompt in PROMPTS:
                (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
                rows.append(
                    {
                        "cond": tensor_json(cond[0][0][0]),
                        "pooled": tensor_json(cond[0][1]["pooled_output"][0]),
                        "extra": sorted(k for k in cond[0][1] if k != "pooled_output"),
                    }
                )
        reference["cases"][case] = {"file": path.name, "sha256": tiny.sha256(path), "conditioning": rows}
        print(case, [r["cond"]["shape"] for r in rows], [r["extra"] for r in rows])
    (HERE / "comfy_hunyuan_video_text_reference.json").write_text(json.dumps(reference) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-hyv-text-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
