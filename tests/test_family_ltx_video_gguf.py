"""LTX-Video GGUF files (ComfyUI-GGUF's "ltxv": Lightricks' names), written here with the ``gguf`` package, through
the real single-file loader.

Oracle: the same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor``, saved as a Lightricks-layout
.safetensors file and loaded through the safetensors path (which tests/test_family_ltx_video_comfy.py holds equal
to ComfyUI's KSampler): the GGUF model's output must be exactly the same. PipeFusion stages hold only their share.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf

from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402

ARCH = "ltxv"


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return tiny_ltx_video_state_dict(TinyLTXVideo(head_dim=8), "gguf")  # 256 wide: whole K blocks per row


def forward(comps) -> torch.Tensor:
    """One transformer call on a 2-frame 2x3 latent with masked T5 states."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 128, 2, 2, 3, generator=g)
    cond = Conditioning(torch.randn(1, 5, 4096, generator=g), None, torch.tensor([[1.0, 1, 1, 0, 0]]))
    mesh = ParallelMesh.single()
    with torch.no_grad():
        return comps.adapter().forward(x, 0.6, cond, mesh, SequenceParallelAttention(mesh, "sdpa")).float()


@pytest.mark.parametrize("quant, fallback", [("Q8_0", "F16"), ("Q4_K", "BF16")])
def test_gguf_equals_comfyui_gguf_s_dequantised_weights(tmp_path, state, quant, fallback):
    path = write_gguf(tmp_path / f"ltx-{quant}.gguf", state, ARCH, quant, fallback, prefix="model.diffusion_model.")
    assert inspect_single_file(path).family == "ltx-video"
    comps = load_single_file_components(path, "cpu", torch.float32)
    layers = gguf_layers(comps.transformer)
    for name in ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn2.to_v", "transformer_blocks.0.ff.net.2"):
        assert layers[name].kind.name == quant
    if quant != "Q8_0":  # Q8_0 is stored as whole bytes too: only the K type's blocks say it stayed packed
        assert all(layer.weight.dtype == torch.uint8 for layer in layers.values() if layer.kind.name == quant)
    kept = [n for n in layers if n.startswith(("time_embed.", "caption_projection.", "proj_in", "proj_out"))]
    assert kept and {layers[n].kind.name for n in kept} <= {fallback}  # the quantiser keeps them
    reference = load_single_file_components(
        comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32), "cpu", torch.float32
    )
    assert not gguf_layers(reference.transformer)
    torch.testing.assert_close(forward(comps), forward(reference), rtol=0, atol=0)


def test_pipefusion_stages_read_only_their_gguf_share(tmp_path, state):
    path = write_gguf(tmp_path / "ltx.gguf", state, ARCH, "Q8_0")
    whole = dict(load_single_file_components(path, "cpu", torch.float32).transformer.named_parameters())
    held = 0
    for stage in (0, 1):
        comps, _, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        params = dict(comps.transformer.named_parameters())
        loaded = {n for n, p in params.items() if p.device.type != "meta"}
        assert 0 < len(loaded) < len(params)
        for name in loaded:
            assert torch.equal(params[name], whole[name]), name
        assert 0 < weights.block_bytes < weights.all_block_bytes
        held += weights.block_bytes
    assert held == weights.all_block_bytes
