"""Qwen-Image and FLUX.2 on every layout in real worker processes equal our single-device result."""

from __future__ import annotations

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

STEPS = 3
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "cfg2": ParallelConfig(cfg=2),
    "pp2": ParallelConfig(pp=2),
}
# Qwen-Image: 336 x 208 px -> 42 x 26 latent -> 21 x 13 tokens (odd: ComfyUI's centring of the rotary grid);
# FLUX.2: the same pixels -> 21 x 13 packed latent pixels, one token each.
WIDTH, HEIGHT = 336, 208
CASES = {"tiny-qwen-image": 2.5, "tiny-flux2": 1.0}  # cfg: FLUX.2 dev runs on embedded guidance


class Reference:
    def __init__(self):
        self.cache = {}

    def case(self, name):
        if name not in self.cache:
            comps = load_pipeline_components(ensure_tiny_model(name), "cpu", torch.float32)
            pos, neg = encode_prompts(comps, comps.family, "a tiny house on a hill", "low quality")
            adapter = comps.adapter()
            factor = adapter.plan.vae_scale_factor
            latent = torch.zeros(1, adapter.plan.latent_channels, HEIGHT // factor, WIDTH // factor)
            settings = SamplingSettings(seed=7, steps=STEPS, cfg=CASES[name], sampler="euler", guidance=4.0)
            ms = model_sampling_for(adapter)
            with torch.no_grad():
                out = denoise_latent(adapter, ParallelMesh.single(), ms, pos, neg, latent, settings)
            self.cache[name] = (pos, neg, latent, settings, out)
        return self.cache[name]


@pytest.fixture(scope="module")
def reference():
    return Reference()


def _cases():
    for layout in LAYOUTS:
        for name in CASES:
            if layout == "cfg2" and CASES[name] == 1.0:
                continue  # one branch: nothing for CFG parallel to split
            yield pytest.param(layout, name, id=f"{layout}-{name}")


@pytest.mark.parametrize("layout, name", list(_cases()))
def test_every_layout_equals_single_device(cpu_pool, reference, layout, name):
    pool = cpu_pool(LAYOUTS[layout])
    pos, neg, latent, settings, expected = reference.case(name)
    pool.submit(load_model, str(ensure_tiny_model(name)), "fp32", "sdpa").result(300)
    extra = dict(patches=3, warmup=STEPS) if layout == "pp2" else {}
    got = pool.submit(generate, pos, neg, latent, settings, **extra).result(300)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4 * max(1.0, expected.abs().max().item())
