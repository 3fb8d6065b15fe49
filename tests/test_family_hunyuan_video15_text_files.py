"""HunyuanVideo 1.5's text encoders from TWO files (Qwen2.5-VL in ComfyUI's qwen_2.5_vl_7b layout, the ByT5 glyph
encoder in byt5_small_glyphxl's: T5's original names), run on the workers by Parallel Text Encode, against
HunyuanVideo15Pipeline.encode_prompt on the same weights (ComfyUI 0.3.64 has no HunyuanVideo 1.5: the pipeline is the
oracle). The tiny pipeline's Qwen2.5-VL is written as a file; its ByT5 is a seeded tiny T5 with ByT5-small's position
range (128), written as a file and given to the pipeline too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.hunyuan_video15.text import template_crop
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_files

FAMILY, NAME = "hunyuan-video-1.5", "tiny-hunyuan-video-1.5"
PROMPTS = ['a shop window with a sign that says "open", warm light', "a dog", 'two signs: "CAFE" and “BAR”']
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from diffusers import HunyuanVideo15Pipeline
    from safetensors.torch import save_file
    from transformers import T5Config, T5EncoderModel

    folder = ensure_tiny_model(NAME)
    pipe = HunyuanVideo15Pipeline.from_pretrained(folder, torch_dtype=torch.float32)
    pipe.prompt_template_encode_start_idx = template_crop(pipe.tokenizer)
    config = T5Config(**{**pipe.text_encoder_2.config.to_dict(), "relative_attention_max_distance": 128})
    torch.manual_seed(7)
    pipe.text_encoder_2 = T5EncoderModel(config).eval()
    out = tmp_path_factory.mktemp("hyv15-text")
    qwen = {f"model.{k}": v.clone().contiguous() for k, v in pipe.text_encoder.state_dict().items()}
    save_file(qwen, str(out / "qwen_2.5_vl_7b_tiny.safetensors"))
    byt5 = {k: v.clone().contiguous() for k, v in pipe.text_encoder_2.state_dict().items()}
    save_file(byt5, str(out / "byt5_small_glyphxl_tiny.safetensors"))
    files = {
        "qwen": (str(out / "qwen_2.5_vl_7b_tiny.safetensors"), str(folder / "tokenizer")),
        "byt5": (str(out / "byt5_small_glyphxl_tiny.safetensors"), str(folder / "tokenizer_2")),
    }
    head_dim = pipe.text_encoder.config.hidden_size // pipe.text_encoder.config.num_attention_heads
    overrides = {"head_dim": head_dim, "rms_norm_eps": pipe.text_encoder.config.rms_norm_eps}
    return pipe, files, overrides


@torch.no_grad()
def test_workers_encode_like_the_pipelines_encode_prompt(cpu_pool, setup):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pipe, files, overrides = setup
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model(NAME)), "fp32", "sdpa").result(300)
    got = pool.submit(encode_text_file, *files["qwen"], PROMPTS, None, overrides, files["byt5"]).result(300)
    worst = 0.0
    for prompt, cond in zip(PROMPTS, got):
        ref, ref_mask, ref2, ref_mask2 = pipe.encode_prompt([prompt], device="cpu", batch_size=1)
        kept, kept2 = int(ref_mask.sum()), int(ref_mask2.sum())
        assert cond.prompt_embeds.shape == ref[:, :kept].shape and cond.attention_mask is None, prompt
        assert cond.extras.byt5.shape == ref2[:, :kept2].shape, prompt
        worst = max(worst, float((cond.prompt_embeds - ref[:, :kept]).abs().max()))
        if kept2:
            worst = max(worst, float((cond.extras.byt5 - ref2[:, :kept2]).abs().max()))
    assert worst <= 1e-5
    assert got[1].extras.byt5.shape[1] == 0  # no quotes: no glyph tokens
    print(f"HunyuanVideo 1.5 text files vs HunyuanVideo15Pipeline.encode_prompt: max |err| {worst:.2e}")


def test_wrong_files_are_refused_on_the_host(setup):
    _, files, _ = setup
    reader = family(FAMILY).text_encoder_file()
    assert check_text_encoder_files(reader, files["byt5"], files["qwen"], FAMILY) == (files["qwen"], files["byt5"])
    with pytest.raises(ConfigError, match="one text-encoder file"):
        check_text_encoder_files(reader, files["qwen"], None, FAMILY)
    with pytest.raises(ConfigError, match="holds no T5 encoder"):
        check_text_encoder_files(reader, files["qwen"], (str(DATA / "tiny_clip_l.safetensors"), "x"), FAMILY)
