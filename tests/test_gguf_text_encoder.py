"""Qwen-Image's text encoder (Qwen2.5-VL) from a llama.cpp GGUF file, as ComfyUI-GGUF's CLIPLoaderGGUF reads it.

A tiny Qwen2.5-VL text model is written twice: as a GGUF (llama.cpp names from the ``gguf`` package's tensor map,
Linear weights and the token embedding Q8_0, norms and biases F32) and, as the oracle, as ComfyUI's
``qwen_2.5_vl_7b.safetensors`` layout holding the same tensors dequantised by ComfyUI-GGUF's own code. Both
encode the same prompts on the workers bit for bit; other architectures are refused by name.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch
from comfy_gguf import comfy_dequantise
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.qwen25_text_file import TEXT_PREFIX, load_qwen25_text_file, qwen25_text_config
from parallel_runtime.parallel.config import ParallelConfig

OVERRIDES = {"head_dim": 16, "rms_norm_eps": 1e-6}
VOCAB = 559  # tiny-qwen-image's tokenizer


def tiny_encoder() -> dict[str, torch.Tensor]:
    """A seeded Qwen2.5-VL text model 64 wide (rows of whole Q8_0 blocks), under ComfyUI's names."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    shapes = {
        TEXT_PREFIX + "embed_tokens.weight": (VOCAB, 64),
        TEXT_PREFIX + "layers.0.self_attn.q_proj.weight": (64, 64),
        TEXT_PREFIX + "layers.0.self_attn.k_proj.weight": (32, 64),
        TEXT_PREFIX + "layers.0.mlp.gate_proj.weight": (128, 64),
        TEXT_PREFIX + "layers.1.": (),
    }
    torch.manual_seed(0)
    model = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**qwen25_text_config(shapes, OVERRIDES)))
    return {TEXT_PREFIX + k: v.detach() for k, v in model.state_dict().items()}


def write_gguf(state: dict[str, torch.Tensor], path: Path, arch: str = "qwen2vl") -> Path:
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, 2)
    writer = gguf.GGUFWriter(path=None, arch=arch)
    for name, value in state.items():
        data = value.float().numpy()
        kind = gguf.GGMLQuantizationType.Q8_0 if value.ndim == 2 else gguf.GGMLQuantizationType.F32
        packed = gguf.quants.quantize(data, kind)
        writer.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), packed, raw_dtype=kind)
    writer.write_header_to_file(path=str(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def comfy_reference(path: Path, out: Path) -> Path:
    """The GGUF's tensors as ComfyUI-GGUF dequantises them (float32 compute), under ComfyUI's names."""
    hf_of = {}
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, 2)
    for name in tiny_encoder():
        hf_of[table.get_name(name, try_suffixes=(".weight", ".bias"))] = name
    tensors = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        value = comfy_dequantise(torch.from_numpy(t.data.copy()), t.tensor_type.name, shape, torch.float32)
        tensors[hf_of[t.name]] = value.float().contiguous()
    save_file(tensors, str(out))
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen-text-gguf")
    path = write_gguf(tiny_encoder(), folder / "Qwen2.5-VL-7B-Instruct-Q8_0.gguf")
    reference = comfy_reference(path, folder / "qwen_2.5_vl_7b.safetensors")
    tokenizer = load_pipeline_components(ensure_tiny_model("tiny-qwen-image"), "cpu", torch.float32, ()).tokenizers
    for stem in (path.stem, reference.stem):
        tokenizer["tokenizer"].save_pretrained(folder / f"{stem}_tokenizer")
    return path, reference


def test_gguf_encoder_keeps_q8_0_blocks_and_equals_comfyui_gguf_s_weights(files):
    path, reference = files
    model = load_qwen25_text_file(path, "cpu", torch.float32, overrides=OVERRIDES)
    layers = gguf_layers(model)
    assert layers and {layer.kind.name for layer in layers.values()} == {"Q8_0"}
    ref = load_qwen25_text_file(reference, "cpu", torch.float32, overrides=OVERRIDES)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        want = ref(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    assert torch.equal(got, want)


def test_workers_encode_with_the_gguf_file_like_comfyui_gguf(cpu_pool, files):
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import encode_text_file

    path, reference = files
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(
        load_model, str(Path(__file__).parent / "data" / "gguf" / "tiny_qwen_image_Q5_1.gguf"), "fp32", "sdpa"
    ).result(300)
    prompts = ["a red fox in the snow", "a lighthouse at dusk"]
    tokenizer = path.parent / f"{path.stem}_tokenizer"
    got = pool.submit(encode_text_file, str(path), str(tokenizer), prompts, None, OVERRIDES).result(300)
    tokenizer = reference.parent / f"{reference.stem}_tokenizer"
    want = pool.submit(encode_text_file, str(reference), str(tokenizer), prompts, None, OVERRIDES).result(300)
    for a, b in zip(got, want):
        assert torch.equal(a.prompt_embeds, b.prompt_embeds)


def test_other_text_architectures_are_refused_by_name_on_the_host(tmp_path, files):
    from parallel_runtime.models.families.qwen_image.text_file import ENCODER_FILE
    from parallel_runtime.service.host_checks import check_text_encoder_file

    tokenizer = str(files[0].parent / f"{files[0].stem}_tokenizer")
    check_text_encoder_file(ENCODER_FILE, str(files[0]), tokenizer)  # nothing to say
    path = write_gguf(tiny_encoder(), tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(ConfigError, match="'llama' GGUF .*Q8_0 x.*not Qwen2.5-VL"):
        check_text_encoder_file(ENCODER_FILE, str(path), tokenizer)
    with pytest.raises(ConfigError, match="'llama' GGUF .*Q8_0 x.*not Qwen2.5-VL"):
        load_qwen25_text_file(path, "cpu", torch.float32, overrides=OVERRIDES)
    t5 = tmp_path / "t5.safetensors"
    save_file({"shared.weight": torch.zeros(4, 4)}, str(t5))
    with pytest.raises(ConfigError, match="does not hold a Qwen2.5-VL text model"):
        check_text_encoder_file(ENCODER_FILE, str(t5), tokenizer)
