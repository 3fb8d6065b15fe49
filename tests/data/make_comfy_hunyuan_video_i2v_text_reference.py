"""Regenerate tests/data/comfy_hunyuan_video_i2v_text_reference.json with ComfyUI's OWN DualCLIPLoader (type
"hunyuan_video") + TextEncodeHunyuanVideo_ImageToVideo: the prompt in HunyuanVideo-I2V's template with an image's
LLaVA vision tokens (a CLIP_VISION_OUTPUT's ``mm_projected``) in place of its ``<image>`` token, every
``image_interleave``-th of them kept in front of the prompt's states.

Run by hand (not in CI) with the Python of ComfyUI's venv (tests/comfyui/comfy_env.py builds it):

    ~/.cache/dit-parallel/comfyui-venv-*/bin/python tests/data/make_comfy_hunyuan_video_i2v_text_reference.py \\
        [--comfy /work/shared/ComfyUI]

The tiny files, tokenizer (tests/data/tiny_llama3_tokenizer, whose ``<image>`` has Llama-3's id 128257) and the
patches that give ComfyUI the tiny sizes are make_comfy_hunyuan_video_text_reference.py's. The vision output is a
stand-in holding generated ``mm_projected`` states [1, tokens, Llama width] (what CLIPVisionEncode gives with
llava_llama3_vision.safetensors). Nothing from parallel_runtime is imported.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_comfy_hunyuan_video_text_reference as text_ref  # noqa: E402
import make_comfy_t5xxl_reference as t5ref  # noqa: E402
import tiny_llava_llama3 as tiny  # noqa: E402
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402
from make_comfy_wan_reference import generated  # noqa: E402

PROMPTS = ["a red fox in the snow", ""]
INTERLEAVES = (1, 2, 4)
VISION_TOKENS = 6


class ClipVisionOutput:
    """What CLIPVisionEncode returns, as far as TextEncodeHunyuanVideo_ImageToVideo reads it."""

    def __init__(self, mm_projected):
        self.mm_projected = mm_projected


def run(args, base: Path) -> None:
    from transformers import CLIPTokenizer

    prepare_comfy(args.comfy, base)
    import comfy  # noqa: F401
    import comfy_extras.nodes_hunyuan as hunyuan

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
    projected, recipe = generated("hunyuan_i2v_text/mm_projected", (1, VISION_TOKENS, tiny.WIDTH), 1.0)
    reference = {
        "comfyui_commit": text_ref.umt5._git(args.comfy),
        "command": "~/.cache/dit-parallel/comfyui-venv-*/bin/python "
        "tests/data/make_comfy_hunyuan_video_i2v_text_reference.py",
        "prompts": PROMPTS,
        "interleaves": list(INTERLEAVES),
        "mm_projected": recipe,
        "clip_file": t5ref.CLIP_FILE,
        "head_dim": tiny.HEAD_DIM,
        "cases": {},
    }
    for case in tiny.FILES:
        path = tiny.write(case, folder)
        rows = []
        with text_ref.patches(clip_config, start, end, len(clip_tokenizer)):
            (clip,) = nodes.DualCLIPLoader().load_clip(t5ref.CLIP_FILE, path.name, type="hunyuan_video")
            for prompt in PROMPTS:
                for interleave in INTERLEAVES:
                    encode = hunyuan.TextEncodeHunyuanVideo_ImageToVideo().encode
                    (cond,) = encode(clip, ClipVisionOutput(projected), prompt, interleave)
                    rows.append(
                        {
                            "prompt": prompt,
                            "image_interleave": interleave,
                            "cond": tensor_json(cond[0][0][0]),
                            "pooled": tensor_json(cond[0][1]["pooled_output"][0]),
                            "extra": sorted(k for k in cond[0][1] if k != "pooled_output"),
                        }
                    )
        reference["cases"][case] = {"file": path.name, "sha256": tiny.sha256(path), "conditioning": rows}
        print(case, [r["cond"]["shape"] for r in rows], [r["extra"] for r in rows])
    (HERE / "comfy_hunyuan_video_i2v_text_reference.json").write_text(json.dumps(reference) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comfy", type=Path, default=Path("/work/shared/ComfyUI"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="comfy-hyv-i2v-text-ref-"))
    try:
        run(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
