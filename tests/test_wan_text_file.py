"""Wan's text encoder from ONE file (UMT5, as ComfyUI's CLIPLoader type "wan" reads it from models/text_encoders),
run on the workers by Parallel Text Encode, against ComfyUI's own CLIPLoader + CLIPTextEncode output from the
same tiny files (tests/data/comfy_umt5_reference.json, made by tests/data/make_comfy_umt5_reference.py):
bf16 and "fp8 scaled" layouts, and a llama.cpp GGUF (Q8_0) against ComfyUI-GGUF's CLIPLoaderGGUF; the tokenizer
the file carries (a GGUF's rebuilt from its metadata), 512-token padding with zeroed padding states, ComfyUI's
(word:1.3) prompt weights.
Wrong files are refused on the host with what / why / fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_file

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "comfy_umt5_reference.json").read_text(encoding="utf-8"))


def _comfy(case: str, index: int) -> tuple[torch.Size, int, torch.Tensor]:
    row = REFERENCE["cases"][case]["conditioning"][index]
    kept = torch.tensor(row["kept"]["data"]).reshape(row["kept"]["shape"])
    return torch.Size(row["shape"]), row["tokens"], kept


@pytest.mark.parametrize("case", ["bf16", "fp8_scaled", "Q8_0"])
def test_workers_encode_like_comfyui_cliploader_wan(cpu_pool, case):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-wan")), "fp32", "sdpa").result(300)
    path = DATA / REFERENCE["cases"][case]["file"]
    got = pool.submit(encode_text_file, str(path), None, REFERENCE["prompts"]).result(300)
    for index, cond in enumerate(got):
        shape, count, kept = _comfy(case, index)
        assert cond.prompt_embeds.shape == shape and cond.pooled is None
        assert (cond.prompt_embeds[0, :count] - kept).abs().max() <= 1e-5, REFERENCE["prompts"][index]
        assert not cond.prompt_embeds[0, count:].any()  # the padding's states are zeros, as ComfyUI's


def test_fp8_scaled_file_keeps_its_linear_layers_in_fp8():
    from parallel_runtime.models.families.wan.text_file import load_umt5_file
    from parallel_runtime.models.fp8 import fp8_layers

    model = load_umt5_file(DATA / REFERENCE["cases"]["fp8_scaled"]["file"], "cpu", torch.float32)
    layers = fp8_layers(model)
    assert len(layers) == 2 * 7 and all(layer.scaled for layer in layers.values())


def test_gguf_keeps_q8_0_blocks_and_rebuilds_the_file_s_tokenizer():
    from parallel_runtime.models.families.wan.text_file import load_umt5_file, umt5_tokenizer
    from parallel_runtime.models.gguf.linear import gguf_layers

    path = DATA / REFERENCE["cases"]["Q8_0"]["file"]
    model = load_umt5_file(path, "cpu", torch.float32)
    layers = gguf_layers(model)
    assert len(layers) == 2 * 7 and {layer.kind.name for layer in layers.values()} == {"Q8_0"}
    assert model.shared.weight.dtype == torch.float16  # the dequantised token table, as ComfyUI-GGUF holds UMT5's
    rebuilt = umt5_tokenizer(str(path))
    stored = umt5_tokenizer(str(DATA / REFERENCE["cases"]["bf16"]["file"]))
    assert rebuilt.processor.get_piece_size() == stored.processor.get_piece_size()
    for prompt in [*REFERENCE["prompts"], "  leading spaces and ümläuts \u00e9 \U0001f600"]:
        assert rebuilt.ids(prompt) == stored.ids(prompt)


def test_wrong_files_are_refused_on_the_host(tmp_path):
    reader = family("wan").text_encoder_file()
    good = DATA / REFERENCE["cases"]["bf16"]["file"]
    check_text_encoder_file(reader, str(good), None)  # the tokenizer is in the file: no folder needed

    state = load_file(str(good))
    no_tokenizer = tmp_path / "umt5_without_tokenizer.safetensors"
    save_file({k: v for k, v in state.items() if k != "spiece_model"}, str(no_tokenizer))
    with pytest.raises(ConfigError, match="holds no tokenizer"):
        check_text_encoder_file(reader, str(no_tokenizer), None)

    other = tmp_path / "clip_l.safetensors"
    save_file({"text_model.encoder.layers.0.mlp.fc1.weight": torch.zeros(4, 4)}, str(other))
    with pytest.raises(ConfigError, match="does not hold a UMT5"):
        check_text_encoder_file(reader, str(other), None)

    v10 = tmp_path / "t5_v1_0.safetensors"
    relu = {k.replace("wi_0", "wi"): v for k, v in state.items() if "wi_1" not in k}
    save_file(relu, str(v10))
    with pytest.raises(ConfigError, match="single ReLU feed-forward"):
        check_text_encoder_file(reader, str(v10), None)

    transformer = DATA / "gguf" / "tiny_qwen_image_Q5_1.gguf"
    with pytest.raises(ConfigError, match="'qwen_image' GGUF .*not UMT5"):
        check_text_encoder_file(reader, str(transformer), None)

    qwen = family("qwen-image").text_encoder_file()
    with pytest.raises(ConfigError, match="no tokenizer found for qwen"):
        check_text_encoder_file(qwen, str(tmp_path / "qwen_2.5_vl_7b.safetensors"), None)
