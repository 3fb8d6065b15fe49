"""The fast paths on a CUDA GPU (marked ``cuda``: skipped without one; dit_devtools/gpu_check.sh runs them).

Oracles: the float64 formula of attention (every kernel the GPU can run, with its logsumexp for Ring), the
exact upcast fp8 product, and the eager model (compiled blocks, caches) on the trained tiny-flux-shapes.
"""

from __future__ import annotations

import pytest
import torch

from parallel_runtime.attention.kernels import KERNELS, describe_choice, usable_backends
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.models.fp8 import Fp8Linear, quantise_per_tensor, set_scale
from parallel_runtime.models.fp8_matmul import apply_fp8_matmul
from parallel_runtime.parallel.mesh import ParallelMesh

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (dit_devtools/gpu_check.sh)"),
]
DEVICE = torch.device("cuda")
TOLERANCE = {"sage": 0.05}  # relative L2 against the formula; SageAttention quantises Q.K^T to INT8
EXACT_TOLERANCE = 0.01  # bf16 kernels


def _formula(q, k, v, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    return (torch.softmax(s, dim=-1) @ v.double()), lse


def _qkv(heads=4, seq=300, dim=128, dtype=torch.bfloat16):
    g = torch.Generator(device=DEVICE).manual_seed(0)
    return (torch.randn(2, heads, seq, dim, generator=g, device=DEVICE, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize(
    "name", [n for n in KERNELS if n in usable_backends(DEVICE)] if torch.cuda.is_available() else []
)
def test_every_usable_kernel_attends_and_gives_ring_its_logsumexp(name):
    q, k, v = _qkv()
    scale = 128**-0.5
    expected, lse = _formula(q, k, v, scale)
    kernel = KERNELS[name]
    out = kernel.attend(q, k, v, scale)
    error = float((out.double() - expected).norm() / expected.norm())
    assert error < TOLERANCE.get(name, EXACT_TOLERANCE), (name, error)
    out2, got_lse = kernel.attend_lse(q, k, v, scale)
    assert got_lse.shape == lse.shape
    torch.testing.assert_close(got_lse.double(), lse, rtol=1e-2, atol=1e-2)
    assert float((out2.double() - expected).norm() / expected.norm()) < TOLERANCE.get(name, EXACT_TOLERANCE)


def test_the_auto_choice_names_a_kernel_that_runs():
    text = describe_choice("auto", DEVICE)
    chosen = text.split(" ")[0]
    assert chosen in usable_backends(DEVICE), text
    q, k, v = _qkv()
    attn = SequenceParallelAttention(ParallelMesh.single(DEVICE), "auto")
    expected, _ = _formula(q, k, v, 128**-0.5)
    assert float((attn(q, k, v).double() - expected).norm() / expected.norm()) < EXACT_TOLERANCE


def test_fp8_product_on_the_gpu_is_close_to_the_upcast_one():
    g = torch.Generator(device=DEVICE).manual_seed(1)
    weight = torch.randn(3072, 1024, generator=g, device=DEVICE) / 32
    layer = Fp8Linear(1024, 3072, bias=True, device=DEVICE)
    values, scale = quantise_per_tensor(weight)
    layer.weight = torch.nn.Parameter(values, requires_grad=False)
    layer.bias = torch.nn.Parameter(torch.zeros(3072, device=DEVICE, dtype=torch.bfloat16), requires_grad=False)
    set_scale(layer, scale, DEVICE)
    x = torch.randn(4, 333, 1024, generator=g, device=DEVICE).to(torch.bfloat16)
    exact = layer(x).float()
    why = apply_fp8_matmul(torch.nn.Sequential(layer), "auto", DEVICE, torch.bfloat16)
    if torch.cuda.get_device_capability() < (8, 9):
        assert layer.matmul == "upcast" and "sm" in why
        return
    assert layer.matmul == "scaled_mm", why
    error = float((layer(x).float() - exact).norm() / exact.norm())
    assert 0.0 < error < 0.06


def test_compiled_blocks_and_block_cache_on_the_gpu_match_eager():
    from parallel_runtime.denoise.caching.specs import BlockCacheSpec
    from parallel_runtime.denoise.loop import denoise_latent
    from parallel_runtime.denoise.model_sampling import model_sampling_for
    from parallel_runtime.denoise.settings import SamplingSettings
    from parallel_runtime.models.builtin import builtin_model_path
    from parallel_runtime.models.compiled_blocks import compile_counters, set_compiled_blocks
    from parallel_runtime.models.loading import load_pipeline_components
    from parallel_runtime.models.text_encoding import encode_prompts

    comps = load_pipeline_components(builtin_model_path("tiny-flux-shapes"), DEVICE, torch.bfloat16)
    adapter, mesh = comps.adapter(), ParallelMesh.single(DEVICE)
    ms = model_sampling_for(adapter, None)
    pos, neg = (c.to(DEVICE) for c in encode_prompts(comps, "flux", "a red circle on a blue background", ""))
    latent = torch.zeros(1, 16, 16, 16, device=DEVICE)

    def run(seed=0, **caches):
        return denoise_latent(
            adapter, mesh, ms, pos, neg, latent, SamplingSettings(seed=seed, steps=8, cfg=2.0, **caches)
        )

    eager = run()
    set_compiled_blocks(adapter, "blocks")
    try:
        compiled = run()
        counts = compile_counters()
        run(seed=1)
        assert compile_counters() == counts
        cached = run(block_cache=BlockCacheSpec(threshold=0.2))
    finally:
        set_compiled_blocks(adapter, "off")
    assert float((compiled - eager).norm() / eager.norm()) < 2e-2  # bf16: kernel fusion reorders the rounding
    assert float((cached - eager).norm() / eager.norm()) < 0.2


def test_ltx_vae_decode_noise_on_the_gpu_is_what_comfyui_draws_after_manual_seed(tmp_path):
    """ComfyUI's decode of an LTX-Video 0.9.1+ VAE on the GPU draws its noise from CUDA's global generator; ours from
    a CUDA generator seeded with the decode's seed: the same numbers after torch.manual_seed(seed), and diffusers'
    decoder drawing from the global generator (as ComfyUI's does) gives our video (TF32 convs: 1e-2)."""
    import sys
    from pathlib import Path

    from safetensors.torch import save_file

    from parallel_runtime.models.families.ltx_video.vae_bands import DECODE_NOISE_SCALE, DECODE_TIMESTEP
    from parallel_runtime.vae.decode import decode_to_image_tensor
    from parallel_runtime.vae.file import load_vae_file

    x = torch.zeros(1, 128, 2, 4, 4, device=DEVICE)
    torch.manual_seed(9)
    theirs = [torch.randn_like(x), torch.randn((16, 16), device=DEVICE)]
    g = torch.Generator(device=DEVICE).manual_seed(9)
    ours = [torch.randn(x.shape, generator=g, device=DEVICE), torch.randn((16, 16), generator=g, device=DEVICE)]
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours, strict=True))

    sys.path.insert(0, str(Path(__file__).parent / "data"))
    from ltx_video_vae_tiny_weights import checkpoint_metadata, tiny_ltx_vae_state_dict

    path = tmp_path / "ltx-vae-091.safetensors"
    save_file(
        {"vae." + k: v.contiguous() for k, v in tiny_ltx_vae_state_dict().items()}, str(path), checkpoint_metadata()
    )
    vae = load_vae_file(path, DEVICE)
    z = torch.randn(1, 128, 2, 4, 4, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    image = decode_to_image_tensor(vae, z, ParallelMesh.single(DEVICE), None, seed=9)
    shape = (1, -1, 1, 1, 1)
    with torch.no_grad():
        torch.manual_seed(9)
        noised = torch.randn_like(z) * DECODE_NOISE_SCALE + (1.0 - DECODE_NOISE_SCALE) * z
        video = vae.decode(
            noised * vae.latents_std.view(shape) + vae.latents_mean.view(shape),
            torch.tensor([DECODE_TIMESTEP], device=DEVICE),
        ).sample
    expected = (video / 2 + 0.5).clamp(0, 1)[0].movedim(0, -1)
    assert (image - expected).abs().max() < 1e-2
    other = decode_to_image_tensor(vae, z, ParallelMesh.single(DEVICE), None, seed=10)
    assert (image - other).abs().max() > 0.05
