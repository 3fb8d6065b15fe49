"""LTX-Video's text encoder from ONE T5-XXL file (t5xxl_fp16 / fp8_e4m3fn_scaled, or a T5 encoder GGUF), run on the
workers by Parallel Text Encode, against ComfyUI's own CLIPLoader (type ltxv; ComfyUI-GGUF's CLIPLoaderGGUF for the
GGUF) + CLIPTextEncode output from the same tiny files (tests/data/comfy_t5xxl_reference.json's ltxv cases, made by
``tests/data/make_comfy_t5xxl_reference.py --add ltxv``): the prompt padded to 128 tokens, the encoder run with the
mask and the padding's states kept (unlike LTXPipeline's unmasked T5 and unlike Wan's zeroed padding), the mask in
the CONDITIONING, ComfyUI's (word:1.3) weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.ltx_video import ID
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_file

DATA = Path(__file__).parent / "data"
TOKENIZER = DATA / "tiny_t5_tokenizer"
REFERENCE = json.loads((DATA / "comfy_t5xxl_reference.json").read_text(encoding="utf-8"))
CASES = {name: case for name, case in REFERENCE["cases"].items() if case["family"] == "ltxv"}


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


def test_workers_encode_like_comfyui_cliploader_ltxv(cpu_pool):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    assert sorted(CASES) == ["ltxv_Q8_0", "ltxv_bf16", "ltxv_fp8_scaled"]
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-ltx-video")), "fp32", "sdpa").result(300)
    names = sorted(CASES)
    files = [str(DATA / CASES[n]["file"]) for n in names]
    got = [pool.submit(encode_text_file, f, str(TOKENIZER), REFERENCE["prompts"]).result(300) for f in files]
    worst = 0.0
    for name, conds in zip(names, got):
        for prompt, cond, want in zip(REFERENCE["prompts"], conds, CASES[name]["conditioning"]):
            expected = _tensor(want["cond"])
            assert cond.prompt_embeds.shape == (1, *expected.shape) == (1, 128, expected.shape[-1]), (name, prompt)
            worst = max(worst, float((cond.prompt_embeds[0] - expected).abs().max()))
            assert (cond.prompt_embeds[0] - expected).abs().max() <= 1e-5, (name, prompt)
            assert cond.pooled is None
            assert torch.equal(cond.attention_mask.long(), torch.tensor(want["attention_mask"])), (name, prompt)
            # the padding's states are not zeros (ComfyUI keeps them; Wan's rule would zero them)
            assert cond.prompt_embeds[0][cond.attention_mask[0] == 0].abs().amax() > 1e-3
    print(f"ltxv text file vs ComfyUI: max |err| {worst:.2e}")


def test_ltxv_refuses_a_umt5_file_on_the_host():
    reader = family(ID).text_encoder_file()
    check_text_encoder_file(reader, str(DATA / CASES["ltxv_bf16"]["file"]), str(TOKENIZER))
    with pytest.raises(ConfigError, match="is a UMT5 encoder"):
        check_text_encoder_file(reader, str(DATA / "tiny_umt5_bf16.safetensors"), str(TOKENIZER))
