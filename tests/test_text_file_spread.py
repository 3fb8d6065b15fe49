"""A Qwen2.5-VL text-encoder FILE larger than what any one GPU has left is spread over the pool's GPUs by
layers, as a diffusers folder's encoder is (``from_pretrained(device_map="auto")``): the decision
(``load_job.text_file_placement``: the file's bytes against each GPU's free memory) and the plan
(``models.layer_spread``: whole decoder layers in order, the embedding on the first GPU, every GPU within its
budget; too little room in all is a ConfigError). This VM has no GPU: the move itself (accelerate's
dispatch) runs where the lead's GPU checks run; on CPU pools the file stays on one device
(tests/test_bigmodels_files.py holds its encoding equal to the folder's)."""

from __future__ import annotations

import pytest
from test_bigmodels_files import _comfy_qwen_text_file

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.layer_spread import layer_device_map
from parallel_runtime.service import load_job
from parallel_runtime.service.load_job import LoadedModel, text_file_placement

GPUS = ("cuda:0", "cuda:1")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path, _ = _comfy_qwen_text_file(tmp_path_factory.mktemp("qwen-text"))
    return path


def _model_on(devices: tuple[str, ...]) -> LoadedModel:
    return LoadedModel(key=(), components=None, adapter=None, attention="sdpa", devices=devices)


def test_a_file_larger_than_any_gpu_has_left_is_spread_over_all(monkeypatch, text_file):
    size = text_file.stat().st_size
    roomy = {g: 4 * size for g in GPUS}
    monkeypatch.setattr(load_job, "free_gpu_bytes", lambda devices: {d: roomy[d] for d in dict.fromkeys(devices)})
    assert text_file_placement(_model_on(GPUS), str(text_file)) == "cuda:0"  # fits one GPU: whole there
    tight = {g: size * 3 // 4 for g in GPUS}  # neither GPU alone, both together
    monkeypatch.setattr(load_job, "free_gpu_bytes", lambda devices: {d: tight[d] for d in dict.fromkeys(devices)})
    assert text_file_placement(_model_on(GPUS + GPUS), str(text_file)) == tight  # 4 ranks on 2 GPUs
    monkeypatch.setattr(load_job, "free_gpu_bytes", lambda devices: {})
    assert text_file_placement(_model_on(("cpu", "cpu")), str(text_file)) == "cpu"


def _device_of(plan: dict[str, str], name: str) -> str:
    """The device the plan gives parameter ``name`` (by its longest planned module prefix)."""
    owner = max((k for k in plan if name == k or name.startswith(k + ".")), key=len)
    return plan[owner]


def test_layer_plan_keeps_decoder_layers_whole_in_order_within_each_budget():
    """A Qwen2.5-VL text model shaped like the 7B (the layers, not the embedding, hold most bytes)."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    config = Qwen2_5_VLTextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, bos_token_id=0, eos_token_id=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]},
    )  # fmt: skip
    encoder = Qwen2_5_VLTextModel(config).eval()
    sizes = {n: p.numel() * p.element_size() for n, p in encoder.named_parameters()}
    total = sum(sizes.values())
    budget = {"cuda:0": total * 7 // 10, "cuda:1": total * 7 // 10}  # accelerate keeps room for one more layer
    plan = layer_device_map(encoder, budget)
    assert _device_of(plan, "embed_tokens.weight") == "cuda:0" and set(plan.values()) == set(GPUS)
    layers = [_device_of(plan, f"layers.{i}.mlp.up_proj.weight") for i in range(8)]
    assert layers == sorted(layers) and len(set(layers)) == 2, layers  # in order: one hop from cuda:0 to cuda:1
    for i in range(8):  # a decoder layer is never split
        assert len({_device_of(plan, n) for n in sizes if n.startswith(f"layers.{i}.")}) == 1
    for gpu in GPUS:
        held = sum(s for n, s in sizes.items() if _device_of(plan, n) == gpu)
        assert 0 < held <= budget[gpu], (gpu, held, budget)
    with pytest.raises(ConfigError, match="does not fit the GPUs' free memory"):
        layer_device_map(encoder, {"cuda:0": total // 4, "cuda:1": total // 4})


def test_t5_encoder_files_are_planned_by_whole_blocks():
    """The T5 / UMT5 encoder of a text-encoder file (``models.t5_encoder``), shaped like T5-XXL: blocks whole and in
    order over the GPUs, the token table on the first."""
    from parallel_runtime.models.t5_encoder import T5Sizes, T5TextEncoder

    encoder = T5TextEncoder(T5Sizes(vocab=64, width=32, inner=32, heads=2, ff=96, blocks=8)).eval()
    sizes = {n: p.numel() * p.element_size() for n, p in encoder.named_parameters()}
    total = sum(sizes.values())
    plan = layer_device_map(encoder, {"cuda:0": total * 7 // 10, "cuda:1": total * 7 // 10})
    assert _device_of(plan, "shared.weight") == "cuda:0" and set(plan.values()) == set(GPUS)
    blocks = [_device_of(plan, f"encoder.block.{i}.layer.1.DenseReluDense.wo.weight") for i in range(8)]
    assert blocks == sorted(blocks) and len(set(blocks)) == 2, blocks
    for i in range(8):
        assert len({_device_of(plan, n) for n in sizes if n.startswith(f"encoder.block.{i}.")}) == 1
