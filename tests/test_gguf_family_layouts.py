"""GGUF files of the families whose GGUF tests run on one device only (FLUX.2, SD3: ``test_gguf_loading``; Z-Image:
``test_family_z_image_gguf``), on a parallel layout: the Parallel Sampler API on Ulysses 2 (real CPU workers) with the GGUF file equals it with the
same tensors dequantised by ComfyUI-GGUF's own ``dequantize_tensor`` and saved as an original-layout .safetensors
file (read through the safetensors path, which their other tests hold equal to ComfyUI / diffusers). ComfyUI 0.3.64
has no FLUX.2, and ComfyUI-GGUF's sd3 files are checked this way rather than against a stored KSampler run. One
pool, every family in one test."""

from __future__ import annotations

import torch
from comfy_gguf import comfy_reference_file
from gguf_files import write_gguf
from test_family_z_image_files import z_image_to_original
from test_gguf_loading import ARCH, original_state

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models import Conditioning
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.registry import adapter_class_for, diffusers_class
from parallel_runtime.models.single_file import inspect_single_file
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

# Chroma's files are architecture "flux", read as Flux.1's are (tests/test_gguf_comfy_reference.py runs those on
# every layout); HunyuanVideo 1.0, LTX-Video and LTX-2 are left to their own files
CASES = (("flux2", "Q8_0", "BF16"), ("sd3", "Q5_1", "F16"), ("z-image", "Q8_0", "BF16"))
ARCHITECTURES = {**ARCH, "z-image": "lumina2"}


def original(family: str) -> dict[str, torch.Tensor]:
    """A tiny transformer of ``family`` in the original layout ComfyUI-GGUF's files use (float32 values)."""
    if family != "z-image":
        return original_state(family)
    comps = load_pipeline_components(ensure_tiny_model("tiny-z-image"), "cpu", torch.float32, ("transformer",))
    return z_image_to_original(comps.transformer.state_dict())


def test_gguf_on_ulysses_2_equals_comfyui_gguf_s_dequantised_weights(pool_registry, tmp_path):
    layout = ParallelConfig(ulysses=2)
    for family, quant, fallback in CASES:
        path = write_gguf(tmp_path / f"{family}-{quant}.gguf", original(family), ARCHITECTURES[family], quant, fallback)
        reference = comfy_reference_file(path, tmp_path / f"{family}-ref.safetensors", torch.float32)
        config = inspect_single_file(path).config
        sizes = adapter_class_for(diffusers_class(str(config["_class_name"]))).config_sizes(config)
        g = torch.Generator().manual_seed(0)
        pooled = sizes.pooled_dim
        branches = [
            Conditioning(
                torch.randn(1, 6, int(sizes.text_dim), generator=g),
                torch.randn(1, int(pooled), generator=g) if pooled else None,
            )
            for _ in range(2)
        ]
        latents = {}
        for label, file in (("gguf", path), ("reference", reference)):
            request = LoadRequest(model=str(file), devices="cpu:2", layout=layout, dtype="fp32")
            model = load_parallel_model(request, pool_registry)
            assert model.family == family
            latents[label] = model.sample(branches[0], branches[1], None, 64, 64, seed=1, steps=2, cfg=2.0)
        error = float((latents["gguf"] - latents["reference"]).abs().max())
        print(f"{family} {quant} on Ulysses 2: max |err| {error:.2e} against ComfyUI-GGUF's dequantised weights")
        assert error <= 1e-6, (family, error)
        assert float(latents["gguf"].abs().max()) > 0.1  # a real latent, not zeros on both sides
