"""Chroma GGUF files as ComfyUI-GGUF's tools write them: its converter takes Chroma's layout (double / single
blocks) for Flux's, so the files say ``general.architecture`` "flux" and the tensor names (the distilled guidance
layer) make them Chroma's; the Linear weights stay in their GGML blocks.

Oracle: the same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor`` (default arithmetic), saved as an
original-layout .safetensors file and loaded through the safetensors path: the GGUF model must sample exactly the
same latent; PipeFusion stages read only their share of the file's bytes."""

from __future__ import annotations

import pytest
import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models import Conditioning
from parallel_runtime.models.families.chroma.keys import (
    _DOUBLE_NAMES,
    _QKV,
    _SINGLE_NAMES,
    GUIDE,
    skeleton,
    to_diffusers,
)
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.gguf.reader import GGUFFile
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

ARCH = "flux"


def _put(state: dict, out: dict, src: str, dst: str) -> None:
    for kind in ("weight", "bias"):
        if f"{src}.{kind}" in state:
            out[f"{dst}.{kind}"] = state[f"{src}.{kind}"]
    if src in state:
        out[dst] = state[src]


def _cat(state: dict, out: dict, srcs: tuple[str, ...], dst: str) -> None:
    for kind in ("weight", "bias"):
        out[f"{dst}.{kind}"] = torch.cat([state[f"{s}.{kind}"] for s in srcs])


def chroma_to_original(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """diffusers' Chroma names -> the original layout ComfyUI reads (fused q/k/v, single blocks' linear1)."""
    out: dict[str, torch.Tensor] = {}
    for dst, src in (("img_in", "x_embedder"), ("txt_in", "context_embedder"), ("final_layer.linear", "proj_out")):
        _put(state, out, src, dst)
    for part in ("in_proj", "out_proj"):
        _put(state, out, f"{GUIDE}.{part}", f"{GUIDE}.{part}")
    for i in range(int(config["approximator_layers"])):
        _put(state, out, f"{GUIDE}.layers.{i}.linear_1", f"{GUIDE}.layers.{i}.in_layer")
        _put(state, out, f"{GUIDE}.layers.{i}.linear_2", f"{GUIDE}.layers.{i}.out_layer")
        out[f"{GUIDE}.norms.{i}.scale"] = state[f"{GUIDE}.norms.{i}.weight"]
    for i in range(int(config["num_layers"])):
        src, dst = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for fused, names in _QKV.items():
            _cat(state, out, tuple(src + n for n in names), dst + fused)
        for a, b in _DOUBLE_NAMES:
            _put(state, out, src + b, dst + a)
    for i in range(int(config["num_single_layers"])):
        src, dst = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        _cat(state, out, tuple(src + n for n in ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")), dst + "linear1")
        for a, b in _SINGLE_NAMES:
            _put(state, out, src + b, dst + a)
    return out


@pytest.fixture(scope="module")
def original() -> dict[str, torch.Tensor]:
    comps = load_pipeline_components(ensure_tiny_model("tiny-chroma"), "cpu", torch.float32, ("transformer",))
    state, config = comps.transformer.state_dict(), comps.transformer_config
    out = chroma_to_original(state, config)
    assert {k: tuple(v.shape) for k, v in out.items()} == skeleton(config)  # the layout is complete
    back = to_diffusers(dict(out), config)
    assert sorted(back) == sorted(state) and all(torch.equal(back[k], state[k]) for k in state)
    return out


def sample(comps, seed: int = 0) -> torch.Tensor:
    """Two euler steps at CFG 1 on fixed noise and fixed T5 states (single device)."""
    adapter = comps.adapter()
    width = comps.transformer_config["joint_attention_dim"]
    g = torch.Generator().manual_seed(seed)
    cond = Conditioning(torch.randn(1, 7, int(width), generator=g))
    shape = (1, adapter.plan.latent_channels, 16, 16)
    start = torch.randn(shape, generator=g)
    settings = SamplingSettings(seed=seed, steps=2, cfg=1.0, sampler="euler", scheduler="simple")
    with torch.no_grad():
        return denoise_latent(
            adapter, ParallelMesh.single(), model_sampling_for(adapter), cond, None, torch.zeros(shape), settings,
            start_model_space=start,
        )  # fmt: skip


@pytest.mark.parametrize("quant, fallback", [("Q8_0", "F16"), ("Q5_0", "BF16")])
def test_chroma_gguf_samples_like_comfyui_gguf_dequantised_weights(tmp_path, original, quant, fallback):
    path = write_gguf(tmp_path / f"chroma-{quant}.gguf", original, ARCH, quant, fallback)
    assert GGUFFile(path).architecture == ARCH
    assert inspect_single_file(path).family == "chroma"  # not Flux: the names decide within "flux"
    comps = load_single_file_components(path, "cpu", torch.float32)
    kinds = {name: layer.kind.name for name, layer in gguf_layers(comps.transformer).items()}
    assert any(name.startswith(f"{GUIDE}.") and k == quant for name, k in kinds.items())
    assert any(name.startswith("single_transformer_blocks.") and k == quant for name, k in kinds.items())
    reference_path = comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32)
    reference = load_single_file_components(reference_path, "cpu", torch.float32)
    assert not gguf_layers(reference.transformer)
    torch.testing.assert_close(sample(comps), sample(reference), rtol=0, atol=0)


def test_pipefusion_stages_read_only_their_chroma_gguf_share(tmp_path, original):
    path = write_gguf(tmp_path / "chroma-Q8_0.gguf", original, ARCH, "Q8_0", prefix="model.diffusion_model.")
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
