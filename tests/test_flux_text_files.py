"""Flux.1's text encoders from TWO files (a T5-XXL file: t5xxl_fp16 / fp8_e4m3fn_scaled or a T5 encoder GGUF, and
clip_l.safetensors), run on the workers by Parallel Text Encode, against ComfyUI's own DualCLIPLoader (type flux;
ComfyUI-GGUF's DualCLIPLoaderGGUF for the GGUF) + CLIPTextEncode output from the same tiny files
(tests/data/comfy_flux_text_reference.json, made by tests/data/make_comfy_t5xxl_reference.py): T5's 256 padded
tokens with ComfyUI's (word:1.3) weights, CLIP-L's pooled output (prompts past CLIP's 77 tokens included). One file
where two are needed, two where one is, and wrong files are refused on the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError, WorkerError
from parallel_runtime.models.families.registry import family
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_files

DATA = Path(__file__).parent / "data"
T5_TOKENIZER, CLIP_TOKENIZER = str(DATA / "tiny_t5_tokenizer"), str(DATA / "tiny_clip_tokenizer")
REFERENCE = json.loads((DATA / "comfy_flux_text_reference.json").read_text(encoding="utf-8"))
CLIP = str(DATA / REFERENCE["clip_file"])
T5_BOUND = 2e-5  # float32 attention over 256 tokens summed in another order than ComfyUI's (77 tokens: <= 1e-5)


def _tensor(stored: dict) -> torch.Tensor:
    return torch.tensor(stored["data"]).reshape(stored["shape"])


def test_workers_encode_like_comfyui_dualcliploader(pool_registry):
    from parallel_runtime.service.api import LoadRequest, load_parallel_model

    path = str(ensure_tiny_model("tiny-flux"))
    model = load_parallel_model(
        LoadRequest(model=path, devices="cpu:2", layout=ParallelConfig(ulysses=2)), pool_registry
    )
    clip = (CLIP, CLIP_TOKENIZER)
    for case, spec in sorted(REFERENCE["cases"].items()):
        prompts = REFERENCE["prompts"][: len(spec["conditioning"])]
        t5 = (str(DATA / spec["file"]), T5_TOKENIZER)
        files = (clip, t5) if case == "flux_fp8_scaled" else (t5, clip)  # either order, as DualCLIPLoader
        cond = model.encode_text(prompts, files[0], text_encoder_2=files[1])
        assert cond.prompt_embeds.shape == (len(prompts), *spec["conditioning"][0]["cond_shape"]), case
        assert cond.attention_mask is None  # ComfyUI passes no mask
        for i, (prompt, want) in enumerate(zip(prompts, spec["conditioning"])):
            if want["cond"] is not None:  # stored for the prompts within CLIP's 77 tokens
                assert (cond.prompt_embeds[i] - _tensor(want["cond"])).abs().max() <= T5_BOUND, (case, prompt)
            assert (cond.pooled[i] - _tensor(want["pooled"])).abs().max() <= 1e-5, (case, prompt)
    with pytest.raises(ConfigError, match=r"one text-encoder file \(tiny_t5_bf16.safetensors\) for a flux model"):
        model.encode_text("a fox", (str(DATA / "tiny_t5_bf16.safetensors"), T5_TOKENIZER))
    with pytest.raises(ConfigError, match="a second text-encoder file .* without a first"):
        model.encode_text("a fox", text_encoder_2=clip)


def test_the_worker_refuses_one_file_for_flux_too(cpu_pool):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-flux")), "fp32", "sdpa").result(300)
    t5 = str(DATA / "tiny_t5_bf16.safetensors")
    with pytest.raises(WorkerError, match="one text-encoder file for a flux model"):
        pool.submit(encode_text_file, t5, T5_TOKENIZER, ["a fox"]).result(300)


def test_the_node_takes_clip_l_as_its_second_file_with_comfyui_s_sd1_tokenizer(tmp_path):
    from node_helpers import RecordingBridge
    from pack_import import load_pack

    load_pack()
    from dit_parallel_pack.nodes.bridge import SHIPPED_TOKENIZERS
    from dit_parallel_pack.nodes.model_files import TEXT_ENCODER_NONE, resolve_text_encoder, second_text_encoder_choices
    from dit_parallel_pack.nodes.text_encode import ParallelTextEncode

    encoders, comfy = tmp_path / "text_encoders", tmp_path / "comfy"
    for folder in (encoders, comfy / "text_encoders", comfy / "sd1_tokenizer"):
        folder.mkdir(parents=True)
    (encoders / "clip_l.safetensors").write_bytes(b"")
    bridge = RecordingBridge(
        folders={"text_encoders": [str(encoders)], SHIPPED_TOKENIZERS: [str(comfy / "text_encoders")]}
    )
    assert second_text_encoder_choices(bridge) == [TEXT_ENCODER_NONE, "clip_l.safetensors"]
    assert resolve_text_encoder(TEXT_ENCODER_NONE, bridge) is None
    assert resolve_text_encoder("clip_l.safetensors", bridge) == (
        str(encoders / "clip_l.safetensors"),
        str(comfy / "sd1_tokenizer"),
    )
    second = next(i for i in ParallelTextEncode.SPEC.inputs if i.name == "text_encoder_2")
    assert second.optional and second.default == TEXT_ENCODER_NONE  # existing workflows stay valid


def test_one_file_for_flux_two_for_others_and_wrong_files_are_refused_on_the_host(tmp_path):
    from safetensors.torch import save_file

    flux = family("flux").text_encoder_file()
    t5 = (str(DATA / "tiny_t5_bf16.safetensors"), T5_TOKENIZER)
    clip = (CLIP, CLIP_TOKENIZER)
    assert check_text_encoder_files(flux, t5, clip, "flux") == (t5, clip)
    assert check_text_encoder_files(flux, clip, t5, "flux") == (t5, clip)  # either order, as DualCLIPLoader
    with pytest.raises(ConfigError, match=r"one text-encoder file \(tiny_t5_bf16.safetensors\) for a flux model"):
        check_text_encoder_files(flux, t5, None, "flux")
    with pytest.raises(ConfigError, match=r"two text-encoder files .* for a pixart model"):
        check_text_encoder_files(family("pixart").text_encoder_file(), t5, clip, "pixart")
    with pytest.raises(ConfigError, match="tiny_t5_bf16.safetensors is not a CLIP text encoder"):
        check_text_encoder_files(flux, t5, (t5[0], CLIP_TOKENIZER), "flux")
    with pytest.raises(ConfigError, match="no tokenizer found for tiny_clip_l"):
        check_text_encoder_files(flux, t5, (CLIP, None), "flux")
    with pytest.raises(ConfigError, match="GGUF CLIP files are not read"):
        check_text_encoder_files(flux, t5, (str(DATA / "tiny_t5_Q8_0.gguf"), CLIP_TOKENIZER), "flux")
    clip_g = tmp_path / "clip_g.safetensors"
    layer = "text_model.encoder.layers.0.mlp.fc1.weight"
    shapes = {"text_model.embeddings.token_embedding.weight": (8, 1280), layer: (4, 1280)}
    shapes["text_model.embeddings.position_embedding.weight"] = (77, 1280)
    save_file({k: torch.zeros(s, dtype=torch.float16) for k, s in shapes.items()}, str(clip_g))
    with pytest.raises(ConfigError, match=r"clip_g.safetensors is a CLIP text encoder 1280 wide \(CLIP-G"):
        check_text_encoder_files(flux, t5, (str(clip_g), CLIP_TOKENIZER), "flux")
