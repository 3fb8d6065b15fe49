"""Regenerate tests/data/comfy_qwen25_text_reference.json with ComfyUI's OWN CLIPLoader (type "qwen_image") and
ComfyUI-GGUF's CLIPLoaderGGUF + CLIPTextEncode, from the tiny Qwen2.5-VL text files of tiny_qwen25_text.py.

Run by hand (not in CI) with the Python of ComfyUI's venv (tests/comfyui/comfy_env.py builds it; it has gguf):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_qwen25_text_reference.py \\
        [--comfy /work/shared/ComfyUI] [--gguf-nodes /work/shared/ComfyUI-GGUF]

What it does, all on the CPU: writes the bf16 safetensors and the Q8_0 GGUF (their sha256 is stored, so the
test knows it remade the same files), loads each as a Qwen-Image text encoder with ComfyUI's tokenizer
(comfy/text_encoders/qwen25_tokenizer) and encodes the prompts with ``nodes.CLIPTextEncode`` (what
TextEncodeQwenImageEdit does without an image); stores each CONDITIONING (ComfyUI drops the template's prefix
itself; a single prompt has no attention mask).

Three things are patched, all sizes: ComfyUI recognises Qwen2.5-VL 7B by a k_proj bias 512 wide
(``comfy.sd.detect_te_model``), so the tiny file is reported as one; it builds the model from fixed sizes
(``Qwen25_7BVLI_Config``, heads 128 wide), so the tiny sizes are given to it; and its vision tower (never run for a text-only prompt, and not in the files) is
built as an empty module instead of 670M random parameters. Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
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
import tiny_qwen25_text as tiny  # noqa: E402 (siblings, found through this folder)
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402

PROMPTS = [
    "a red fox in the snow",
    "A lighthouse at dusk, waves crashing against the rocks.",
    "",
    "a (red:1.3) fox, ünïcödé 漢字\nsecond line",  # Qwen's tokenizer takes the weight syntax as text
]


class NoVision(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()


def encode_all(nodes, gguf_nodes, name: str) -> list[torch.Tensor]:
    import comfy.sd
    import comfy.text_encoders.llama as llama

    class TinyConfig(llama.Qwen25_7BVLI_Config):
        head_dim = tiny.HEAD_DIM
        rope_dims = tiny.ROPE_SECTIONS

    config = functools.partial(
        TinyConfig,
        vocab_size=tiny.VOCAB,
        hidden_size=tiny.WIDTH,
        intermediate_size=tiny.FF,
        num_hidden_layers=tiny.LAYERS,
        num_attention_heads=tiny.HEADS,
        num_key_value_heads=tiny.KV_HEADS,
    )
    with (
        mock.patch.object(comfy.sd, "detect_te_model", lambda sd: comfy.sd.TEModel.QWEN25_7B),
        mock.patch.object(llama, "Qwen25_7BVLI_Config", config),
        mock.patch.object(llama.qwen_vl, "Qwen2VLVisionTransformer", NoVision),
    ):
        if name.endswith(".gguf"):
            (clip,) = gguf_nodes.CLIPLoaderGGUF().load_clip(name, type="qwen_image")
        else:
            (clip,) = nodes.CLIPLoader().load_clip(name, type="qwen_image")
        out = []
        for prompt in PROMPTS:
            (cond,) = nodes.CLIPTextEncode().encode(clip, prompt)
            assert len(cond) == 1 and "attention_mask" not in cond[0][1], cond[0][1].keys()
            out.append(cond[0][0].float())
    return out


def run(args, base: Path) -> None:
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

    folder = base / "models" / "text_encoders"
    folder.mkdir(parents=True, exist_ok=True)
    reference = {
        "comfyui_commit": _git(args.comfy),
        "comfyui_gguf_commit": _git(args.gguf_nodes),
        "command": "~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_qwen25_text_reference.py",
        "prompts": PROMPTS,
        "head_dim": tiny.HEAD_DIM,
        "cases": {},
    }
    for case in tiny.FILES:
        path = tiny.write(case, folder)
        conds = encode_all(nodes, gguf_nodes, path.name)
        reference["cases"][case] = {
            "file": path.name,
            "sha256": tiny.sha256(path),
            "conditioning": [tensor_json(c[0]) for c in conds],
        }
        print(case, [tuple(c.shape) for c in conds], [float(c.abs().max()) for c in conds])
    (HERE / "comfy_qwen25_text_reference.json").write_text(json.dumps(reference, indent=1) + "\n")


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
    base = Path(tempfile.mkdtemp(prefix="comfy-qwen25-text-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
