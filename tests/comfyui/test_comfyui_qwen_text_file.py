"""Qwen-Image's text encoder from ONE file (Qwen2.5-VL: ComfyUI's qwen_2.5_vl_7b.safetensors layout, and a
llama.cpp GGUF as ComfyUI-GGUF's CLIPLoaderGGUF reads it), run on the workers by Parallel Text Encode with the
tokenizer ComfyUI ships, against ComfyUI's own CLIPLoader / CLIPLoaderGGUF (type qwen_image) + CLIPTextEncode on
the same tiny files (tests/data/comfy_qwen25_text_reference.json, made by
tests/data/make_comfy_qwen25_text_reference.py; the files are made again here from the same seed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.parallel.config import ParallelConfig

DATA = Path(__file__).parents[1] / "data"
REFERENCE = json.loads((DATA / "comfy_qwen25_text_reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    sys.path.insert(0, str(DATA))
    try:
        import tiny_qwen25_text
    finally:
        sys.path.remove(str(DATA))
    folder = tmp_path_factory.mktemp("qwen25-text")
    out = {}
    for case, entry in REFERENCE["cases"].items():
        out[case] = tiny_qwen25_text.write(case, folder)
        assert tiny_qwen25_text.sha256(out[case]) == entry["sha256"], "not the file ComfyUI encoded"
    return out


@pytest.mark.parametrize("case", ["bf16", "Q8_0"])
def test_workers_encode_like_comfyui_cliploader_qwen_image(cpu_pool, comfy_snapshot, files, case):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-qwen-image")), "fp32", "sdpa").result(300)
    tokenizer = comfy_snapshot / "comfy" / "text_encoders" / "qwen25_tokenizer"
    overrides = {"head_dim": REFERENCE["head_dim"]}  # the tiny file's; Qwen2.5-VL 7B's is 128
    got = pool.submit(encode_text_file, str(files[case]), str(tokenizer), REFERENCE["prompts"], None, overrides)
    got = got.result(300)
    for prompt, cond, want in zip(REFERENCE["prompts"], got, REFERENCE["cases"][case]["conditioning"]):
        want = torch.tensor(want["data"]).reshape(want["shape"])
        assert cond.prompt_embeds.shape == (1, *want.shape) and cond.attention_mask is None, prompt
        assert (cond.prompt_embeds[0] - want).abs().max() <= 1e-5, prompt
