"""FLUX.2's Mistral text encoder from a llama.cpp GGUF (general.architecture "llama"), as ComfyUI-GGUF's
CLIPLoaderGGUF reads it. ComfyUI 0.3.64 has no FLUX.2, so the oracle is the Mistral .safetensors path
(tests/test_flux2_text_file.py: equal to Flux2Pipeline) on the same weights: each Linear weight quantised to Q8_0
in transformers' row order and dequantised by ComfyUI-GGUF's own code. The GGUF is written as llama.cpp's
converter writes it: its names, query / key rows of each head in interleaved pairs, the tokenizer as
tokenizer.ggml.* metadata (byte-level tokens, specials as control tokens, pre-tokenizer "tekken")."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from bigmodel_files import save  # tests/ helpers
from comfy_gguf import comfy_dequantise

from dit_devtools.tiny.tekken import tekken_json, tekken_tokenizer
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.flux2.text_file import (
    ENCODER_FILE,
    LAYERS_BUILT,
    load_mistral_text_file,
    prompt_token_ids,
    tokenizer_of_file,
)
from parallel_runtime.models.families.flux2.text_gguf import TEKKEN_PATTERN
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.service.host_checks import check_text_encoder_file

PROMPTS = ["a red fox in the snow", "A lighthouse at dusk, oil painting; ünïcödé 123!"]
HEADS, KV_HEADS, HEAD_DIM, WIDTH = 4, 2, 16, 64
META = {"rope_theta": 1e9, "rms_norm_eps": 1e-5}


@pytest.fixture(scope="module")
def tekken() -> bytes:
    """The tiny tekken vocabulary, with tekken's own split pattern (what a GGUF's pre-tokenizer 'tekken' means)."""
    data = json.loads(tekken_json())
    data["config"]["pattern"] = TEKKEN_PATTERN
    return json.dumps(data).encode()


@pytest.fixture(scope="module")
def files(tekken, tmp_path_factory):
    """(GGUF, the oracle .safetensors) of one seeded Mistral model 64 wide, 30 layers."""
    from transformers import MistralConfig, MistralModel

    folder = tmp_path_factory.mktemp("mistral-gguf")
    tokenizer = tekken_tokenizer(tekken, folder)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=LAYERS_BUILT,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        rope_theta=META["rope_theta"],
        rms_norm_eps=META["rms_norm_eps"],
    )
    torch.manual_seed(0)
    state = {"model." + k: v.detach() for k, v in MistralModel(config).state_dict().items()}
    oracle = {}
    for name, value in state.items():
        if value.ndim == 2:
            packed = torch.from_numpy(gguf.quants.quantize(value.numpy(), gguf.GGMLQuantizationType.Q8_0))
            value = comfy_dequantise(packed, "Q8_0", tuple(value.shape), torch.float32)
        oracle[name] = value.float().contiguous()
    oracle["tekken_model"] = torch.frombuffer(bytearray(tekken), dtype=torch.uint8)
    reference = save(oracle, folder / "mistral_3_small_flux2_bf16.safetensors")
    path = write_gguf(state, tokenizer, folder / "Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf")
    return path, reference


def interleave_pairs(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter's reorder of a head's query / key rows: halves (rotate-half) to interleaved pairs."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def write_gguf(state, tokenizer, path, arch: str = "llama", with_tokenizer: bool = True):
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, LAYERS_BUILT)
    writer = gguf.GGUFWriter(path=None, arch=arch)
    writer.add_block_count(LAYERS_BUILT)
    writer.add_embedding_length(WIDTH)
    writer.add_feed_forward_length(2 * WIDTH)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(META["rope_theta"])
    writer.add_layer_norm_rms_eps(META["rms_norm_eps"])
    if with_tokenizer:
        special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("tekken")
        writer.add_token_list(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
        writer.add_token_types([3 if i in special else 1 for i in range(len(tokenizer))])
    for name, value in state.items():
        if name.endswith("q_proj.weight"):
            value = interleave_pairs(value, HEADS)
        elif name.endswith("k_proj.weight"):
            value = interleave_pairs(value, KV_HEADS)
        kind = gguf.GGMLQuantizationType.Q8_0 if value.ndim == 2 else gguf.GGMLQuantizationType.F32
        packed = gguf.quants.quantize(value.float().numpy(), kind)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), packed, raw_dtype=kind)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_keeps_q8_0_blocks_and_equals_the_safetensors_path_on_comfyui_gguf_s_weights(files):
    path, reference = files
    model = load_mistral_text_file(path, "cpu", torch.float32)  # head width, RoPE base, epsilon: the file's
    assert {layer.kind.name for layer in gguf_layers(model).values()} == {"Q8_0"}
    oracle = load_mistral_text_file(reference, "cpu", torch.float32, overrides={"head_dim": HEAD_DIM, **META})
    ids = torch.randint(0, model.config.vocab_size, (1, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(input_ids=ids, output_hidden_states=True).hidden_states
        want = oracle(input_ids=ids, output_hidden_states=True).hidden_states
    for layer in (10, 20, 30):
        torch.testing.assert_close(got[layer], want[layer], rtol=0, atol=1e-6)


def test_tokenizer_rebuilt_from_the_metadata_gives_the_files_tokens(files):
    path, reference = files
    got, want = tokenizer_of_file(str(path)), tokenizer_of_file(str(reference))
    for prompt in PROMPTS:
        assert prompt_token_ids(got, prompt) == prompt_token_ids(want, prompt), prompt


def test_workers_encode_with_the_gguf_like_the_safetensors_file(cpu_pool, files):
    from dit_devtools.tiny import ensure_tiny_model
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    path, reference = files
    check_text_encoder_file(ENCODER_FILE, str(path), None)  # nothing to say
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-flux2")), "fp32", "sdpa").result(300)
    got = pool.submit(encode_text_file, str(path), None, PROMPTS).result(300)
    overrides = {"head_dim": HEAD_DIM, **META}
    want = pool.submit(encode_text_file, str(reference), None, PROMPTS, None, overrides).result(300)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.prompt_embeds, b.prompt_embeds, rtol=0, atol=1e-5)


def test_other_gguf_files_are_refused_on_the_host(files, tmp_path):
    from safetensors.torch import load_file

    path, reference = files
    state = {k: v for k, v in load_file(reference).items() if k != "tekken_model"}
    tokenizer = tokenizer_of_file(str(reference))
    qwen = write_gguf(state, tokenizer, tmp_path / "Qwen2.5-VL-7B-Q8_0.gguf", arch="qwen2vl")
    with pytest.raises(ConfigError, match="'qwen2vl' GGUF .*not Mistral Small 3"):
        check_text_encoder_file(ENCODER_FILE, str(qwen), None)
    bare = write_gguf(state, tokenizer, tmp_path / "bare.gguf", with_tokenizer=False)
    with pytest.raises(ConfigError, match="bare.gguf holds no tekken tokenizer"):
        check_text_encoder_file(ENCODER_FILE, str(bare), None)
