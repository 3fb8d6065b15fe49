"""Z-Image's text encoder (Qwen3) from a llama.cpp GGUF (general.architecture "qwen3"), as ComfyUI-GGUF's
CLIPLoaderGGUF reads it. ComfyUI 0.3.64 has no Z-Image text encoder, so the oracle is ComfyUI's
``qwen_3_4b.safetensors`` path (tests/test_family_z_image_files.py: equal to the diffusers folder) holding the
GGUF's tensors as ComfyUI-GGUF's own code dequantises them. A tiny Qwen3 64 wide is written as llama.cpp lays it
out: names from the ``gguf`` package's tensor map, Linear weights and the token embedding Q8_0, norms F32, RoPE base
and norm epsilon as qwen3.* metadata (not Qwen3-4B's, so they must be read from the file)."""

from __future__ import annotations

import gguf
import pytest
import torch
from comfy_gguf import comfy_dequantise
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.families.z_image.text_file import ENCODER_FILE, TEXT_PREFIX, load_qwen3_text_file
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.host_checks import check_text_encoder_file

META = {"rope_theta": 5000.0, "rms_norm_eps": 1e-5}  # not Qwen3-4B's 1e6 / 1e-6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(GGUF, ComfyUI-GGUF's dequantisation of it as a qwen_3_4b .safetensors, tokenizer folder)."""
    from transformers import Qwen3Config, Qwen3Model

    folder = tmp_path_factory.mktemp("qwen3-gguf")
    tokenizer = load_pipeline_components(ensure_tiny_model("tiny-z-image"), "cpu", torch.float32, ()).tokenizers
    tokenizer["tokenizer"].save_pretrained(folder / "tokenizer")
    config = Qwen3Config(
        vocab_size=len(tokenizer["tokenizer"]),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=META["rope_theta"],
        rms_norm_eps=META["rms_norm_eps"],
    )
    torch.manual_seed(0)
    state = {TEXT_PREFIX + k: v.detach() for k, v in Qwen3Model(config).state_dict().items()}
    path = write_gguf(state, folder / "Qwen3-4B-Q8_0.gguf")
    hf_of = {}
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, 2)
    for name in state:
        hf_of[table.get_name(name, try_suffixes=(".weight", ".bias"))] = name
    tensors = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        value = comfy_dequantise(torch.from_numpy(t.data.copy()), t.tensor_type.name, shape, torch.float32)
        tensors[hf_of[t.name]] = value.float().contiguous()
    reference = folder / "qwen_3_4b.safetensors"
    save_file(tensors, str(reference))
    return path, reference, folder / "tokenizer"


def write_gguf(state: dict[str, torch.Tensor], path, arch: str = "qwen3"):
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, 2)
    writer = gguf.GGUFWriter(path=None, arch=arch)
    writer.add_rope_freq_base(META["rope_theta"])
    writer.add_layer_norm_rms_eps(META["rms_norm_eps"])
    for name, value in state.items():
        kind = gguf.GGMLQuantizationType.Q8_0 if value.ndim == 2 else gguf.GGMLQuantizationType.F32
        packed = gguf.quants.quantize(value.float().numpy(), kind)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), packed, raw_dtype=kind)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_keeps_q8_0_blocks_and_equals_comfyui_gguf_s_weights(files):
    path, reference, _ = files
    model = load_qwen3_text_file(path, "cpu", torch.float32)
    assert {layer.kind.name for layer in gguf_layers(model).values()} == {"Q8_0"}
    oracle = load_qwen3_text_file(reference, "cpu", torch.float32, overrides=META)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(input_ids=ids, output_hidden_states=True).hidden_states
        want = oracle(input_ids=ids, output_hidden_states=True).hidden_states
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_workers_encode_with_the_gguf_like_the_safetensors_file(cpu_pool, files):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    path, reference, tokenizer = files
    check_text_encoder_file(ENCODER_FILE, str(path), str(tokenizer))  # nothing to say
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model("tiny-z-image")), "fp32", "sdpa").result(300)
    prompts = ["a red fox in the snow", "a lighthouse at dusk"]
    got = pool.submit(encode_text_file, str(path), str(tokenizer), prompts).result(300)
    want = pool.submit(encode_text_file, str(reference), str(tokenizer), prompts, None, META).result(300)
    for a, b in zip(got, want):
        assert torch.equal(a.prompt_embeds, b.prompt_embeds)


def test_other_files_are_refused_on_the_host(files, tmp_path):
    from safetensors.torch import load_file

    _, reference, tokenizer = files
    qwen25 = write_gguf(load_file(reference), tmp_path / "Qwen2.5-VL-7B-Q8_0.gguf", arch="qwen2vl")
    with pytest.raises(ConfigError, match="'qwen2vl' GGUF .*Q8_0 x.*not Qwen3"):
        check_text_encoder_file(ENCODER_FILE, str(qwen25), str(tokenizer))
    t5 = tmp_path / "t5.safetensors"
    save_file({"shared.weight": torch.zeros(4, 4)}, str(t5))
    with pytest.raises(ConfigError, match="does not hold a Qwen3 text model"):
        check_text_encoder_file(ENCODER_FILE, str(t5), str(tokenizer))
