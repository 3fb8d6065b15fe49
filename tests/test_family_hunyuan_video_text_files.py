"""HunyuanVideo 1.0's text encoders from TWO files (LLaVA-Llama-3: llava_llama3_fp16 / fp8_scaled's layouts, and
CLIP-L: clip_l.safetensors'), run on the workers by Parallel Text Encode, against ComfyUI's own DualCLIPLoader (type
hunyuan_video) + CLIPTextEncode on the same tiny files (tests/data/comfy_hunyuan_video_text_reference.json, made by
tests/data/make_comfy_hunyuan_video_text_reference.py; the Llama files are made again here from the same seed).
What is compared: ComfyUI's whole text path from the prompt string (its template, its tokenization with the tiny
Llama-3-id tokenizer tests/data/tiny_llama3_tokenizer, standing in for its missing llama_tokenizer file; its
template crop, third-last layer, prompt weights) and CLIP-L's pooled output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.hunyuan_video import ID
from parallel_runtime.models.families.hunyuan_video.text_file import prompt_span
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_files

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "comfy_hunyuan_video_text_reference.json").read_text(encoding="utf-8"))
LLAMA_TOKENIZER = DATA / "tiny_llama3_tokenizer"
CLIP = (str(DATA / REFERENCE["clip_file"]), str(DATA / "tiny_clip_tokenizer"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    sys.path.insert(0, str(DATA))
    try:
        import tiny_llava_llama3
    finally:
        sys.path.remove(str(DATA))
    folder = tmp_path_factory.mktemp("llava-llama3")
    out = {}
    for case, entry in REFERENCE["cases"].items():
        out[case] = tiny_llava_llama3.write(case, folder)
        assert tiny_llava_llama3.sha256(out[case]) == entry["sha256"], "not the file ComfyUI encoded"
    return out


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


def test_workers_encode_like_comfyui_dualcliploader_hunyuan_video(cpu_pool, files):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-hunyuan-video")), "fp32", "sdpa").result(300)
    overrides = {"head_dim": REFERENCE["head_dim"]}  # the tiny file's; Llama-3 8B's is 128
    worst = {}
    for case in sorted(REFERENCE["cases"]):
        job = pool.submit(
            encode_text_file, str(files[case]), str(LLAMA_TOKENIZER), REFERENCE["prompts"], None, overrides, CLIP
        )
        got = job.result(300)
        worst[case] = 0.0
        for prompt, cond, want in zip(REFERENCE["prompts"], got, REFERENCE["cases"][case]["conditioning"]):
            expected = _tensor(want["cond"])
            assert want["extra"] == [] and cond.attention_mask is None, prompt  # one prompt: no mask either side
            assert cond.prompt_embeds.shape == (1, *expected.shape), prompt
            error = float((cond.prompt_embeds[0] - expected).abs().max())
            worst[case] = max(worst[case], error)
            assert error <= 1e-5, (case, prompt)
            assert (cond.pooled[0] - _tensor(want["pooled"])).abs().max() <= 1e-5, (case, prompt)
    print("HunyuanVideo text files vs ComfyUI, max |err|:", worst)


def test_a_llama_gguf_encodes_as_the_safetensors_path_on_comfyui_gguf_s_weights(cpu_pool, tmp_path):
    """A llava-llama-3 GGUF (as ComfyUI-GGUF's DualCLIPLoaderGGUF reads it) encodes as the safetensors path (equal
    to ComfyUI above) on the weights ComfyUI-GGUF dequantises from it. ComfyUI-GGUF itself is not run: it undoes
    the query / key reorder for Llama-3 8B's 32 / 8 heads only, which the tiny model does not have."""
    from bigmodel_files import save
    from llama_gguf_files import write_llama_gguf

    from parallel_runtime.models.families.hunyuan_video.text_file import load_llama3_file
    from parallel_runtime.models.gguf.linear import gguf_layers
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    sys.path.insert(0, str(DATA))
    try:
        import tiny_llava_llama3 as tiny
    finally:
        sys.path.remove(str(DATA))
    path = tmp_path / "llava-llama-3-8b-tiny-Q8_0.gguf"
    oracle = save(write_llama_gguf(tiny, path), tmp_path / "llava_llama3_oracle.safetensors")
    assert {layer.kind.name for layer in gguf_layers(load_llama3_file(path, "cpu", torch.float32)).values()} == {"Q8_0"}
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-hunyuan-video")), "fp32", "sdpa").result(300)
    tokenizer, prompts = str(LLAMA_TOKENIZER), REFERENCE["prompts"]
    got = pool.submit(encode_text_file, str(path), tokenizer, prompts, None, None, CLIP).result(300)
    overrides = {"head_dim": tiny.HEAD_DIM}
    want = pool.submit(encode_text_file, str(oracle), tokenizer, prompts, None, overrides, CLIP).result(300)
    worst = max(float((a.prompt_embeds - b.prompt_embeds).abs().max()) for a, b in zip(got, want))
    assert all(a.prompt_embeds.shape == b.prompt_embeds.shape for a, b in zip(got, want))
    assert worst <= 1e-5, worst
    print(f"HunyuanVideo Llama GGUF vs the safetensors path on ComfyUI-GGUF's weights: max |err| {worst:.2e}")


def test_prompt_span_finds_the_user_turn():
    template = [128000, 128006, 9, 128007, 271, 5, 6, 128009, 128006, 882, 128007]
    assert prompt_span(template + [271, 40, 41, 128009]) == (12, 15)  # the prompt's tokens and <|eot_id|>
    assert prompt_span(template + [272, 40, 128009]) == (10, 14)  # no "\n\n": from the end-of-header token
    assert prompt_span([128000, 40, 41]) == (0, 3)  # no template: every state


def test_wrong_files_are_refused_on_the_host(files):
    reader = family(ID).text_encoder_file()
    llama = (str(files["fp16"]), str(LLAMA_TOKENIZER))
    assert check_text_encoder_files(reader, CLIP, llama, ID) == (llama, CLIP)  # either order, as DualCLIPLoader
    with pytest.raises(ConfigError, match="one text-encoder file"):
        check_text_encoder_files(reader, llama, None, ID)
    with pytest.raises(ConfigError, match="does not hold a Llama text model"):
        check_text_encoder_files(reader, (str(DATA / "tiny_t5_bf16.safetensors"), "x"), CLIP, ID)
    with pytest.raises(ConfigError, match="'qwen_image' GGUF"):  # a GGUF of another architecture
        check_text_encoder_files(reader, (str(DATA / "gguf" / "tiny_qwen_image_Q5_1.gguf"), "x"), CLIP, ID)
