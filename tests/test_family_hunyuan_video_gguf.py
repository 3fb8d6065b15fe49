"""HunyuanVideo 1.0 GGUF files (ComfyUI-GGUF's "hyvid": Tencent's names, the 5-D patch embedding appended as
fix_5d_tensors.py does), written here with the ``gguf`` package, through the real single-file loader.

Oracle: the same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor``, saved as a Tencent-layout
.safetensors file and loaded through the safetensors path (which tests/test_family_hunyuan_video_comfy.py holds
equal to ComfyUI's KSampler): the GGUF model's output must be exactly the same. PipeFusion stages hold only their
share; a file without the patch embedding names the fix.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf

from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from hunyuan_video_tiny_weights import TinyHunyuanVideo, tiny_hunyuan_video_state_dict  # noqa: E402

ARCH = "hyvid"


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return tiny_hunyuan_video_state_dict(TinyHunyuanVideo(), "gguf")


def forward(comps) -> torch.Tensor:
    """One transformer call on a 2-frame 4x4 latent with guidance 6 (the distilled guidance input)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 2, 4, 4, generator=g)
    cond = Conditioning(torch.randn(1, 5, 32, generator=g), torch.randn(1, 768, generator=g))
    mesh = ParallelMesh.single()
    with torch.no_grad():
        attention = SequenceParallelAttention(mesh, "sdpa")
        return comps.adapter().forward(x, 600.0, cond, mesh, attention, guidance=6.0).float()


@pytest.mark.parametrize("quant, fallback", [("Q8_0", "F16"), ("Q4_K", "BF16")])
def test_gguf_equals_comfyui_gguf_s_dequantised_weights(tmp_path, state, quant, fallback):
    path = write_gguf(tmp_path / f"hunyuan-{quant}.gguf", state, ARCH, quant, fallback, prefix="model.diffusion_model.")
    assert inspect_single_file(path).family == "hunyuan-video"
    comps = load_single_file_components(path, "cpu", torch.float32)
    layers = gguf_layers(comps.transformer)
    assert layers["transformer_blocks.0.attn.to_q"].kind.name == quant  # fused q-k-v cut into rows, still blocks
    assert layers["single_transformer_blocks.0.proj_mlp"].kind.name == quant  # linear1's last rows
    if quant != "Q8_0":  # Q8_0 is stored as whole bytes too: only the K type's blocks say it stayed packed
        assert all(layer.weight.dtype == torch.uint8 for layer in layers.values() if layer.kind.name == quant)
    kept = [n for n in layers if n.startswith(("context_embedder.", "x_embedder.", "time_text_embed.", "proj_out"))]
    assert {layers[n].kind.name for n in kept} <= {fallback}  # txt_in, time_in, ...: the quantiser keeps them
    reference = load_single_file_components(
        comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32), "cpu", torch.float32
    )
    assert not gguf_layers(reference.transformer)
    torch.testing.assert_close(forward(comps), forward(reference), rtol=0, atol=0)


def test_pipefusion_stages_read_only_their_gguf_share(tmp_path, state):
    path = write_gguf(tmp_path / "hunyuan.gguf", state, ARCH, "Q8_0")
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


def test_a_file_without_its_5d_patch_embedding_names_the_fix(tmp_path, state):
    raw = {k: v for k, v in state.items() if k != "img_in.proj.weight"}
    path = write_gguf(tmp_path / "hunyuan-raw.gguf", raw, ARCH, "Q8_0")
    with pytest.raises(ConfigError, match="fix_5d_tensors.py"):
        inspect_single_file(path)
