"""HiDream-I1 GGUF files as ComfyUI-GGUF's tools write them (``general.architecture`` "hidream", the release's
names, which are diffusers'; embedders, caption projections and the final layer in the fallback type, the MoE
gates F32): the Linear weights stay in their GGML blocks, experts included.

Oracles:
- ComfyUI 0.3.64's KSampler on ComfyUI-GGUF's ``UnetLoaderGGUF`` of the same tiny files (Q8_0, Q4_0, and the
  K-quants Q4_K and Q6_K: random valid blocks in the experts' and feed-forwards' w2, whose rows are whole 256-value
  blocks): tests/data/comfy_hidream_gguf_reference.json, written by tests/data/make_comfy_hidream_gguf_reference.py.
  The Parallel Sampler (node and API) on one rank, Ulysses 2 (not Q6_K) and (Q8_0) PipeFusion 2 (warmup = steps:
  exact) within 1e-4; with two LoRA files stacked (LoraLoaderModelOnly on the GGUF model vs the Parallel LoRA
  Loader), the same.
- The same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor`` (default arithmetic), saved as a
  .safetensors file and loaded through the safetensors path: the GGUF model samples exactly the same latent.
- A PipeFusion stage reads only its share of the file's GGML bytes and holds the whole model's tensors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from comfy_gguf import comfy_reference_file
from comfy_ksampler_cases import (
    LAYOUTS,
    TOLERANCE,
    layout_params,
    node_context,
    relative_error,
    sample_both_ways,
    tensor_reader,
)
from test_family_hidream_comfy import api_branch, comfy_conditioning

from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.hidream.conditioning import HiDreamText
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.gguf.reader import GGUFFile
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.lora import LoraSpec

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_hidream_gguf_reference.json").read_text(encoding="utf-8"))
GGUF_LAYOUTS = {k: LAYOUTS[k] for k in ("1rank", "ulysses2", "pipefusion2")}
ON_PARALLEL = tuple(f"{q}.hidream_default_euler" for q in ("Q8_0", "Q4_0", "Q4_K"))  # Q6_K: one rank
PLAIN = [case for case in REFERENCE["cases"] if not case.get("loras")]
WITH_LORAS = [case for case in REFERENCE["cases"] if case.get("loras")]
STEPS = max(case["steps"] for case in REFERENCE["cases"])
tensor = tensor_reader(REFERENCE)


def model_file(quant: str) -> Path:
    entry = REFERENCE["models"][quant]
    path = DATA / entry["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], f"{path} is not the file ComfyUI ran"
    return path


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return node_context(pool_registry)


@pytest.mark.parametrize(
    ("layout", "case"),
    layout_params(
        PLAIN,
        GGUF_LAYOUTS,
        lambda layout, name: name in ON_PARALLEL and (layout != "pipefusion2" or name.startswith("Q8_0")),
    ),
)
def test_parallel_sampler_equals_comfyui_gguf_ksampler(node_ctx, pool_registry, layout, case):
    node = case.get("model_sampling")
    errors = sample_both_ways(
        node_ctx,
        pool_registry,
        str(model_file(case["model"])),
        GGUF_LAYOUTS[layout],
        case,
        STEPS,
        tensor,
        comfy_conditioning,
        api_branch,
        None if node is None else node["inputs"],
    )
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} ({case['what']}) on {layout}: {errors}"


@pytest.mark.parametrize("layout", list(GGUF_LAYOUTS))
def test_lora_stack_on_gguf_samples_as_comfyui_gguf(pool_registry, layout):
    """The Parallel LoRA Loader on the GGUF model: patches on quantised (attention, experts), F32 and F16 weights."""
    (case,) = WITH_LORAS
    devices, config = GGUF_LAYOUTS[layout]
    request = LoadRequest(model=str(model_file(case["model"])), devices=devices, layout=config, pp_warmup=STEPS)
    model = load_parallel_model(request, pool_registry)
    specs = [LoraSpec.of(DATA / "lora" / f"{stem}.safetensors", strength) for stem, strength in case["loras"]]
    latent = tensor(case["latent"]["samples"])
    settings = {k: case[k] for k in ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")}
    args = (
        api_branch(case["positive"]),
        api_branch(case["negative"]),
        latent,
        latent.shape[-1] * 8,
        latent.shape[-2] * 8,
    )
    expected = tensor(case["expected"]["samples"])
    error = relative_error(model.with_loras(*specs).sample(*args, **settings), expected)
    assert error <= TOLERANCE, f"{layout}: relative error {error:.2e} against ComfyUI-GGUF + LoraLoaderModelOnly"
    assert relative_error(model.sample(*args, **settings), expected) > 100 * TOLERANCE  # the LoRAs matter


def sample(comps, seed: int = 0) -> torch.Tensor:
    """Two euler steps at CFG 1 on fixed noise, T5, pooled and Llama states (single device)."""
    adapter = comps.adapter()
    config = comps.transformer_config
    t5, llama = config["caption_channels"]
    g = torch.Generator().manual_seed(seed)
    layers = len(config["llama_layers"])
    text = HiDreamText(torch.randn(1, layers, 5, llama, generator=g))
    cond = Conditioning(
        torch.randn(1, 6, t5, generator=g), torch.randn(1, config["text_emb_dim"], generator=g), None, text
    )
    shape = (1, adapter.plan.latent_channels, 8, 8)
    start = torch.randn(shape, generator=g)
    settings = SamplingSettings(seed=seed, steps=2, cfg=1.0, sampler="euler", scheduler="simple")
    with torch.no_grad():
        return denoise_latent(
            adapter, ParallelMesh.single(), model_sampling_for(adapter), cond, None, torch.zeros(shape), settings,
            start_model_space=start,
        )  # fmt: skip


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_0", "Q4_K", "Q6_K"])
def test_hidream_gguf_keeps_blocks_and_samples_like_comfyui_gguf_dequantised_weights(tmp_path, quant):
    path = model_file(quant)
    assert GGUFFile(path).architecture == "hidream"
    assert inspect_single_file(path).family == "hidream-i1"
    comps = load_single_file_components(path, "cpu", torch.float32)
    kinds = {name: layer.kind.name for name, layer in gguf_layers(comps.transformer).items()}
    assert kinds["double_stream_blocks.0.block.ff_i.experts.0.w2"] == quant  # the routed experts stay quantised
    assert kinds["single_stream_blocks.1.block.ff_i.shared_experts.w2"] == quant
    assert sum(kind == quant for kind in kinds.values()) == (22 if quant.endswith("_K") else 94)
    # 32-value rows: whole Q8_0 / Q4_0 blocks, not 256-value K blocks (then F32, as the converter leaves 1,024 values)
    assert kinds["single_stream_blocks.1.block.attn1.to_q"] == ("F32" if quant.endswith("_K") else quant)
    assert kinds["caption_projection.0.linear"] != quant  # the quantiser keeps the caption projections
    gate = comps.transformer.get_parameter("double_stream_blocks.0.block.ff_i.gate.weight")
    assert gate.dtype == torch.float32 and gate.device.type == "cpu"  # a plain parameter, F32 in the file
    reference_path = comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32)
    reference = load_single_file_components(reference_path, "cpu", torch.float32)
    assert not gguf_layers(reference.transformer)
    torch.testing.assert_close(sample(comps), sample(reference), rtol=0, atol=0)


def test_pipefusion_stages_read_only_their_hidream_gguf_share():
    path = model_file("Q8_0")
    whole_params = dict(load_single_file_components(path, "cpu", torch.float32).transformer.named_parameters())
    held = 0
    for stage in (0, 1):
        comps, _plan, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        params = dict(comps.transformer.named_parameters())
        assert params.keys() == whole_params.keys()
        loaded = {n for n, p in params.items() if p.device.type != "meta"}
        assert 0 < len(loaded) < len(params)
        for name in loaded:
            assert torch.equal(params[name], whole_params[name]), name
        assert 0 < weights.block_bytes < weights.all_block_bytes
        held += weights.block_bytes
    assert held == weights.all_block_bytes
