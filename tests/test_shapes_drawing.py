"""tiny-flux-shapes draws what the prompt asks for: the README's first command, and every layout.

The oracle is a simple colour/shape detector (``dit_devtools/training/shapes_detector``: nearest palette colour per pixel,
connected blobs, shape from how much of its bounding box a blob fills). The contrast prompts (same seed,
only the shape word changed) show that the shape comes from the prompt, not from a blob that happens to
be round."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from dit_devtools.training.shapes_detector import detect
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.builtin import builtin_model_path
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode, generate

README_PROMPT = "a green square on a yellow background"  # one it draws cleanly (its circles are lumpy)
PX, STEPS, CFG = 128, 12, 2.0  # the README command's size, steps and guidance
SHAPES_CHECKED = ("circle", "square", "triangle")


def _main_blob(image: np.ndarray):
    found = detect(image)
    assert found.blobs, f"no shape found (background {found.background})"
    return found.background, found.blobs[0]


def test_readme_command_draws_a_clean_green_square_on_yellow(tmp_path):
    out = tmp_path / "out.png"
    command = [sys.executable, "-m", "parallel_runtime", "generate", "--model", "tiny-flux-shapes"]
    command += ["--devices", "cpu:2", "--ulysses", "2", "--prompt", README_PROMPT]
    command += ["--width", str(PX), "--height", str(PX), "--steps", str(STEPS), "--cfg-scale", str(CFG)]
    command += ["--out", str(out)]
    subprocess.run(command, check=True, timeout=600, capture_output=True)
    image = np.asarray(Image.open(out).convert("RGB"), dtype=np.float32) / 255.0
    background, blob = _main_blob(image)
    assert (background, blob.colour, blob.shape) == ("yellow", "green", "square")
    assert blob.area >= 0.1 * PX * PX  # a shape, not a speck
    assert blob.fill >= 0.92 and 0.85 <= blob.aspect <= 1.18, f"not a clean square: {blob}"  # the first picture


LAYOUTS = {
    "single": ParallelConfig(),
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "pipefusion2": ParallelConfig(pp=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_draws_the_shape_the_prompt_names(cpu_pool, layout):
    comps = load_pipeline_components(builtin_model_path("tiny-flux-shapes"), "cpu", torch.float32)
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, str(builtin_model_path("tiny-flux-shapes")), "fp32", "sdpa").result(300)
    latent = torch.zeros(1, 16, PX // 8, PX // 8)
    settings = SamplingSettings(seed=0, steps=STEPS, cfg=CFG, sampler="euler", scheduler="simple")
    for shape in SHAPES_CHECKED:
        pos, neg = encode_prompts(comps, "flux", f"a red {shape} on a blue background", "")
        raw = pool.submit(generate, pos, neg, latent, settings).result(300)
        image = pool.submit(decode, raw).result(300)
        background, blob = _main_blob(np.asarray(image[0].clamp(0, 1)))
        assert (background, blob.colour, blob.shape) == ("blue", "red", shape), (layout, shape)
