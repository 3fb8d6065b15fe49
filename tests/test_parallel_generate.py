"""Sequence- and CFG-parallel denoising in real worker processes equals our single-device result."""

from __future__ import annotations

import time

import pytest
import torch

from dit_devtools.tiny import build_tiny_pipeline, ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import JobCancelled, WorkerError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.runtime.builtin_jobs import echo
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, encode_text, generate

FAMILIES = ["tiny-flux", "tiny-sd3", "tiny-pixart"]
LAYOUTS = {
    "single": ParallelConfig(),
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "ulysses2xring2": ParallelConfig(ring=2, ulysses=2),
    "cfg2xulysses2": ParallelConfig(cfg=2, ulysses=2),
}
# 208 x 336 px: a 26 x 42 latent, 13 x 21 = 273 image tokens (divisible by neither 2 nor 4).
WIDTH, HEIGHT = 336, 208


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """float32 agreement: 1e-4 absolute, scaled by the magnitude when values are large (the random
    tiny PixArt's raw latents reach the hundreds)."""
    return (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())


class Reference:
    """Single-device (in-process) results, computed once per case."""

    def __init__(self):
        self.cache = {}
        self.components = {}

    def components_for(self, name):
        if name not in self.components:
            self.components[name] = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)
        return self.components[name]

    def case(self, name, cfg):
        key = (name, cfg)
        if key not in self.cache:
            comps = self.components_for(name)
            pos, neg = encode_prompts(comps, comps.family, "a tiny house on a hill", "low quality")
            adapter = comps.adapter()
            latent = torch.zeros(1, adapter.plan.latent_channels, HEIGHT // 8, WIDTH // 8)
            settings = SamplingSettings(seed=7, steps=3, cfg=cfg, sampler="euler", scheduler="simple", guidance=3.5)
            ms = model_sampling_for(adapter)
            out = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings)
            self.cache[key] = (pos, neg, latent, settings, out)
        return self.cache[key]


@pytest.fixture(scope="module")
def reference():
    return Reference()


def _cases():
    for layout in LAYOUTS:
        for name in FAMILIES:
            if layout.startswith("cfg") and name == "tiny-flux":
                continue  # Flux dev uses embedded guidance, no CFG branches to split
            yield pytest.param(layout, name, id=f"{layout}-{name}")


@pytest.mark.parametrize("layout, name", list(_cases()))
def test_parallel_equals_single_device(cpu_pool, reference, layout, name):
    pool = cpu_pool(LAYOUTS[layout])
    cfg = 1.0 if name == "tiny-flux" else 4.0
    pos, neg, latent, settings, expected = reference.case(name, cfg)
    pool.submit(load_model, str(ensure_tiny_model(name)), "fp32", "sdpa").result(300)
    events = []
    got = pool.submit(generate, pos, neg, latent, settings, on_event=lambda *e: events.append(e)).result(300)
    assert got.shape == expected.shape
    assert _close(got, expected)
    for rank in range(pool.config.world_size):  # every rank reports its own steps
        assert [p["step"] for r, kind, p in events if kind == "progress" and r == rank] == [1, 2, 3]
    assert {r for r, kind, _ in events if kind == "memory"} == set(range(pool.config.world_size))
    assert {r for r, kind, _ in events if kind == "preview"} == {0}


def test_three_heads_with_ulysses_two(cpu_pool, tmp_path):
    """Head count not divisible by the Ulysses degree: heads are split unevenly, still exact."""
    path = build_tiny_pipeline("tiny-sd3", tmp_path / "sd3-3heads", num_attention_heads=3)
    comps = load_pipeline_components(path, "cpu", torch.float32)
    pos, neg = encode_prompts(comps, "sd3", "three heads", "")
    adapter = comps.adapter()
    latent = torch.zeros(1, 16, 10, 14)
    settings = SamplingSettings(seed=1, steps=2, cfg=3.0)
    ms = model_sampling_for(adapter)
    expected = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings)
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pool.submit(load_model, str(path), "fp32", "sdpa").result(300)
    got = pool.submit(generate, pos, neg, latent, settings).result(300)
    assert _close(got, expected)


def test_odd_latent_fails_early_with_clear_message(cpu_pool):
    pool = cpu_pool(LAYOUTS["ulysses2"])
    # PixArt does not pad to whole patches (ComfyUI's PixArt fails there too); Flux and SD3 pad and crop
    pool.submit(load_model, str(ensure_tiny_model("tiny-pixart")), "fp32", "sdpa").result(300)
    comps = load_pipeline_components(ensure_tiny_model("tiny-pixart"), "cpu", torch.float32, parts=("text",))
    pos, _ = encode_prompts(comps, "pixart", "x", "")
    latent = torch.zeros(1, 4, 25, 41)  # 200 x 328 px: 25 x 41 latent rows/cols do not form 2x2 patches
    with pytest.raises(WorkerError) as info:
        pool.submit(generate, pos, None, latent, SamplingSettings(steps=2)).result(120)
    assert "does not divide into 2x2 patches" in str(info.value) and "fix:" in str(info.value)
    assert pool.submit(echo, 1).result(30) == 1


def test_cancel_mid_generation_keeps_pool_warm(cpu_pool, reference):
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pos, neg, latent, _, _ = reference.case("tiny-sd3", 4.0)
    pool.submit(load_model, str(ensure_tiny_model("tiny-sd3")), "fp32", "sdpa").result(300)
    pids = pool.pids
    seen = []
    fut = pool.submit(
        generate,
        pos,
        neg,
        latent,
        SamplingSettings(steps=500, cfg=4.0),
        on_event=lambda r, kind, p: seen.append(kind),
    )
    deadline = time.monotonic() + 60
    while "progress" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    fut.cancel()
    with pytest.raises(JobCancelled):
        fut.result(30)
    assert seen.count("progress") < 500
    assert pool.submit(echo, "warm").result(30) == "warm" and pool.pids == pids


@pytest.mark.parametrize("name", ["tiny-sd3", "tiny-pixart"])
def test_decode_job_equals_diffusers_vae_on_a_raw_latent(cpu_pool, reference, name):
    """A raw VAE latent (ComfyUI's LATENT convention, e.g. from ComfyUI's own KSampler) decodes to
    the IMAGE diffusers' AutoencoderKL gives, through the exact parallel decode on 2 ranks."""
    comps = reference.components_for(name)
    latent = torch.randn(1, comps.vae.config.latent_channels, 13, 18, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = (comps.vae.decode(latent).sample / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pool.submit(load_model, str(ensure_tiny_model(name)), "fp32", "sdpa").result(300)
    image = pool.submit(decode, latent).result(300)
    assert image.shape == (1, 104, 144, 3)
    assert (image - ref).abs().max().item() <= 1e-4


def test_text_encoder_placement_spreads_biggest_first():
    from parallel_runtime.service.load_job import text_encoder_placement

    sizes = {"text_encoder": 246, "text_encoder_2": 1390, "text_encoder_3": 9524}
    assert text_encoder_placement(sizes, ["cuda:0", "cuda:1"]) == {
        "text_encoder_3": "cuda:0",
        "text_encoder_2": "cuda:1",
        "text_encoder": "cuda:1",
    }
    assert set(text_encoder_placement(sizes, ["cpu", "cpu"]).values()) == {"cpu"}
    four = text_encoder_placement(sizes, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"])
    assert len(set(four.values())) == 3


@pytest.mark.parametrize("name", ["tiny-sd3", "tiny-flux"])
def test_encode_job_equals_in_process_encoding(cpu_pool, reference, name):
    """Text encoding on the workers (encoders placed by text_encoder_placement) gives the values of
    the pipeline's own encoders run in-process (themselves checked against diffusers elsewhere)."""
    comps = reference.components_for(name)
    expected, _ = encode_prompts(comps, comps.family, "a quiet harbour at night", "")
    pool = cpu_pool(LAYOUTS["ulysses2"])
    pool.submit(load_model, str(ensure_tiny_model(name)), "fp32", "sdpa").result(300)
    (got,) = pool.submit(encode_text, ["a quiet harbour at night"]).result(120)
    assert torch.equal(got.prompt_embeds, expected.prompt_embeds)
    assert torch.equal(got.pooled, expected.pooled)
