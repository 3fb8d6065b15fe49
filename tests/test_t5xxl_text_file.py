"""Chroma's, PixArt's and SD3's text encoder from ONE T5-XXL file (t5xxl_fp16 / fp8_e4m3fn_scaled, or a T5 encoder GGUF),
run on the workers by Parallel Text Encode, against ComfyUI's own CLIPLoader (type chroma / pixart / sd3; ComfyUI-GGUF's
CLIPLoaderGGUF for the GGUF) + CLIPTextEncode output from the same tiny files (tests/data/comfy_t5xxl_reference.json,
made by tests/data/make_comfy_t5xxl_reference.py): Chroma's and PixArt's unpadded tokens (not the PixArt
pipelines' lower-cased 120 / 300 padded ones), SD3's 77 padded tokens with zero
pooled output, ComfyUI's (word:1.3) prompt weights, the weights held in float16 as ComfyUI holds them. Wrong files
are refused on the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_file

DATA = Path(__file__).parent / "data"
TOKENIZER = DATA / "tiny_t5_tokenizer"
REFERENCE = json.loads((DATA / "comfy_t5xxl_reference.json").read_text(encoding="utf-8"))
MODELS = {"chroma": "tiny-chroma", "sd3": "tiny-sd3", "pixart": "tiny-pixart"}


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


@pytest.mark.parametrize("case", sorted(c for c, s in REFERENCE["cases"].items() if s["family"] in MODELS))
def test_workers_encode_like_comfyui_cliploader(cpu_pool, case):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    spec = REFERENCE["cases"][case]
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model(MODELS[spec["family"]])), "fp32", "sdpa").result(300)
    path = DATA / spec["file"]
    got = pool.submit(encode_text_file, str(path), str(TOKENIZER), REFERENCE["prompts"]).result(300)
    for prompt, cond, want in zip(REFERENCE["prompts"], got, spec["conditioning"]):
        expected = _tensor(want["cond"])
        assert cond.prompt_embeds.shape == (1, *expected.shape), prompt
        assert (cond.prompt_embeds[0] - expected).abs().max() <= 1e-5, prompt
        if want["pooled"] is None:
            assert cond.pooled is None
        else:
            assert torch.equal(cond.pooled, _tensor(want["pooled"]))  # SD3 without CLIP: zeros
        assert cond.attention_mask is None  # ComfyUI passes no mask for either


def test_wrong_files_are_refused_on_the_host(tmp_path):
    chroma = family("chroma").text_encoder_file()
    t5 = DATA / REFERENCE["files"]["bf16"]
    check_text_encoder_file(chroma, str(t5), str(TOKENIZER))
    with pytest.raises(ConfigError, match="no tokenizer found for tiny_t5_bf16"):
        check_text_encoder_file(chroma, str(t5), None)
    for other in ("sd3", "pixart"):
        with pytest.raises(ConfigError, match="is a UMT5 encoder"):
            check_text_encoder_file(family(other).text_encoder_file(), str(DATA / "tiny_umt5_bf16.safetensors"), "x")
    with pytest.raises(ConfigError, match="'qwen_image' GGUF .*not T5-XXL"):
        check_text_encoder_file(chroma, str(DATA / "gguf" / "tiny_qwen_image_Q5_1.gguf"), "x")
