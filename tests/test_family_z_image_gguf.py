"""Z-Image GGUF files as ComfyUI-GGUF's tools write them (``general.architecture`` "lumina2", original-layout
names, the refiners and embedders kept unquantised) through the real single-file loader, the Linear weights kept
in their GGML blocks.

Oracle: the same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor`` (default arithmetic), saved as
an original-layout .safetensors file and loaded through the safetensors path: the GGUF model must sample exactly
the same latent; a PipeFusion stage reads only its share of the file's bytes and holds the whole model's tensors."""

from __future__ import annotations

import pytest
import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf
from test_family_z_image_files import z_image_to_original

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models import Conditioning
from parallel_runtime.models.gguf.linear import gguf_layers
from parallel_runtime.models.gguf.reader import GGUFFile
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.pipefusion.stage_loading import load_single_file_stage

ARCH = "lumina2"  # what ComfyUI-GGUF's converter detects Z-Image's layout as (cap_embedder + context_refiner qkv)


@pytest.fixture(scope="module")
def original() -> dict[str, torch.Tensor]:
    comps = load_pipeline_components(ensure_tiny_model("tiny-z-image"), "cpu", torch.float32, ("transformer",))
    return z_image_to_original(comps.transformer.state_dict())


def sample(comps, seed: int = 0) -> torch.Tensor:
    """Two euler steps of the loaded transformer on fixed noise and a fixed caption (single device)."""
    adapter = comps.adapter()
    width = adapter.config_sizes(comps.transformer_config).text_dim
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


@pytest.mark.parametrize("quant, fallback", [("Q8_0", "F16"), ("Q4_1", "BF16")])
def test_z_image_gguf_samples_like_comfyui_gguf_dequantised_weights(tmp_path, original, quant, fallback):
    path = write_gguf(tmp_path / f"z_image_turbo-{quant}.gguf", original, ARCH, quant, fallback)
    assert GGUFFile(path).architecture == ARCH
    info = inspect_single_file(path)
    assert (info.family, info.variant) == ("z-image", "z-image-6b")
    comps = load_single_file_components(path, "cpu", torch.float32)
    layers = gguf_layers(comps.transformer)
    kept = {name: layer.kind.name for name, layer in layers.items()}
    assert quant in kept.values()
    assert any(name.startswith("layers.") and ".attention.to_q" in name and k == quant for name, k in kept.items())
    assert not any(name.startswith(("noise_refiner.", "context_refiner.")) and k == quant for name, k in kept.items())
    reference_path = comfy_reference_file(path, tmp_path / "ref.safetensors", torch.float32)
    reference = load_single_file_components(reference_path, "cpu", torch.float32)
    assert not gguf_layers(reference.transformer)
    torch.testing.assert_close(sample(comps), sample(reference), rtol=0, atol=0)


def test_pipefusion_stages_read_only_their_z_image_gguf_share(tmp_path, original):
    path = write_gguf(tmp_path / "z_image_turbo-Q8_0.gguf", original, ARCH, "Q8_0", prefix="model.diffusion_model.")
    whole_params = dict(load_single_file_components(path, "cpu", torch.float32).transformer.named_parameters())
    held = 0
    for stage in (0, 1):
        comps, _plan, weights = load_single_file_stage(path, 2, stage, "cpu", torch.float32)
        params = dict(comps.transformer.named_parameters())
        assert params.keys() == whole_params.keys()
        loaded = {n for n, p in params.items() if p.device.type != "meta"}
        assert 0 < len(loaded) < len(params)
        for name in loaded:
            assert torch.equal(params[name], whole_params[name]), name  # the same blocks / values
        assert weights.param_bytes == sum(params[n].numel() * params[n].element_size() for n in loaded)
        assert 0 < weights.block_bytes < weights.all_block_bytes
        held += weights.block_bytes
    assert held == weights.all_block_bytes
