"""HunyuanVideo 1.5 GGUF files (ComfyUI-GGUF's tools/convert.py names Comfy-Org's files "hyvid": they hold the names
it tells HunyuanVideo 1.0 by; the 5-D patch embedding appended as fix_5d_tensors.py does), written here with the
``gguf`` package, through the real single-file loader.

Oracle: the same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor``, saved as a .safetensors file and
loaded through the safetensors path (which tests/test_family_hunyuan_video15_files.py holds equal to the diffusers
folder): the GGUF model's output must be exactly the same, on one device and Ulysses 2. PipeFusion stages hold only
their share; a file without the patch embedding names the fix."""

from __future__ import annotations

import contextlib

import pytest
import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf
from hunyuan_video15_original import to_original

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models import Conditioning, get_adapter
from parallel_runtime.models.families.hunyuan_video15.conditioning import GlyphText
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_transformer
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

ARCH = "hyvid"


@pytest.fixture(scope="module")
def comfy_state() -> dict[str, torch.Tensor]:
    """The tiny transformer in Comfy-Org's repackaged layout (fused double-block q/k/v)."""
    comps = load_pipeline_components(ensure_tiny_model("tiny-hunyuan-video-1.5"), "cpu", torch.float32,
                                     parts=("transformer",))  # fmt: skip
    return to_original(comps.transformer.state_dict(), fused=True)


class Plain:
    def intercept(self):
        return contextlib.nullcontext()


def forward(model) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 2, 3, 4, generator=g)
    cond = Conditioning(torch.randn(1, 7, 32, generator=g), extras=GlyphText(torch.randn(1, 4, 32, generator=g)))
    with torch.no_grad():
        return get_adapter(model).forward(x, torch.tensor([600.0]), cond, ParallelMesh.single(), Plain())


@pytest.mark.parametrize("quant, fallback", [("Q8_0", "F16"), ("Q4_K", "BF16")])
def test_gguf_equals_comfyui_gguf_s_dequantised_weights(tmp_path, comfy_state, quant, fallback):
    path = write_gguf(tmp_path / f"hunyuanvideo1.5-{quant}.gguf", comfy_state, ARCH, quant, fallback)
    assert inspect_single_file(path).family == "hunyuan-video-1.5"  # not HunyuanVideo 1.0, the same architecture
    model, _, _ = load_single_file_transformer(path, "cpu", torch.float32)
    layers = gguf_layers(model)
    if quant == "Q8_0":  # the tiny blocks are 64 wide: Q4_K's 256-element blocks fit only the ByT5 mapper
        assert layers["transformer_blocks.0.attn.to_q"].kind.name == quant  # fused q-k-v cut into rows
        assert layers["transformer_blocks.1.attn.add_v_proj"].kind.name == quant
    assert layers["context_embedder_2.linear_2"].kind.name == quant  # byt5_in: quantised
    kept = [n for n in layers if n.startswith(("context_embedder.", "x_embedder.", "time_embed.", "proj_out"))]
    kinds = {layers[n].kind.name for n in kept}
    assert fallback in kinds and kinds <= {fallback, "F32"}  # txt_in, time_in, ...: left unquantised (tiny: F32)
    reference, _, _ = load_single_file_transformer(
        comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32), "cpu", torch.float32
    )
    assert not gguf_layers(reference)
    torch.testing.assert_close(forward(model), forward(reference), rtol=0, atol=0)


def test_pipefusion_stages_read_only_their_gguf_share(tmp_path, comfy_state):
    path = write_gguf(tmp_path / "hunyuanvideo1.5.gguf", comfy_state, ARCH, "Q8_0")
    whole = dict(load_single_file_transformer(path, "cpu", torch.float32)[0].named_parameters())
    held = 0
    for stage in (0, 1):
        comps, _, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        params = dict(comps.transformer.named_parameters())
        loaded = {n for n, p in params.items() if p.device.type != "meta"}
        assert 0 < len(loaded) < len(params)
        assert {n.split(".")[1] for n in loaded if n.startswith("transformer_blocks.")} == {str(stage)}
        for name in loaded:
            assert torch.equal(params[name], whole[name]), name
        held += weights.block_bytes
    assert held == weights.all_block_bytes


def test_a_file_without_its_5d_patch_embedding_names_the_fix(tmp_path, comfy_state):
    raw = {k: v for k, v in comfy_state.items() if k != "img_in.proj.weight"}
    with pytest.raises(ConfigError, match="fix_5d_tensors.py"):
        inspect_single_file(write_gguf(tmp_path / "hunyuanvideo1.5-raw.gguf", raw, ARCH, "Q8_0"))


@torch.no_grad()
def test_gguf_on_ulysses_2_equals_one_device_on_comfyui_gguf_s_weights(cpu_pool, tmp_path, comfy_state):
    from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
    from parallel_runtime.parallel.config import ParallelConfig
    from parallel_runtime.service.load_job import load_model
    from parallel_runtime.service.model_jobs import generate

    path = write_gguf(tmp_path / "hunyuanvideo1.5-Q8_0.gguf", comfy_state, ARCH, "Q8_0")
    reference, _, _ = load_single_file_transformer(
        comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32), "cpu", torch.float32
    )
    g = torch.Generator().manual_seed(4)
    pos = Conditioning(torch.randn(1, 9, 32, generator=g), extras=GlyphText(torch.randn(1, 5, 32, generator=g)))
    neg = Conditioning(torch.randn(1, 6, 32, generator=g), extras=GlyphText(torch.randn(1, 0, 32)))
    settings = SamplingSettings(seed=5, steps=2, cfg=4.0, sampler="euler", scheduler="simple")
    latent = torch.zeros(1, 8, 3, 3, 5)
    adapter = get_adapter(reference)
    expected = denoise_latent(adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, latent, settings)
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    got = pool.submit(generate, pos, neg, latent, settings).result(600)
    err = ((got - expected).norm() / expected.norm()).item()
    assert got.shape == expected.shape and err <= 1e-5, f"relative L2 error {err:.2e}"
