"""Z-Image LoRA files on the workers (ComfyUI 0.3.64 has no Z-Image: the oracle is the LoRA formula): one file in
four namings (ComfyUI's fused ``diffusion_model.layers.N.attention.qkv`` split over diffusers' to_q / to_k / to_v,
kohya's ``lora_unet_*`` with alpha, AI-Toolkit's diffusers names under ``diffusion_model.``, PEFT's ``transformer.``)
sampled on 1 rank, Ulysses 2 and PipeFusion 2 (warmup = steps: exact) equals our single device with the weights
merged by W + strength * alpha / rank * up @ down; an empty stack gives back the plain model's output.
(tests/test_family_z_image_files.py checks the same namings' patches weight for weight, in process.)"""

from __future__ import annotations

import pytest
import torch
from lora_formula_cases import LoraCase, LoraModule, relative  # tests/ helper

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig

LAYOUTS = {"1rank": ParallelConfig(), "ulysses2": ParallelConfig(ulysses=2), "pp2": ParallelConfig(pp=2)}
MODULES = [
    LoraModule("diffusion_model.layers.0.attention.qkv", tuple(f"layers.0.attention.to_{p}.weight" for p in "qkv")),
    LoraModule("lora_unet_noise_refiner_0_feed_forward_w1", ("noise_refiner.0.feed_forward.w1.weight",), kohya=True),
    LoraModule("diffusion_model.layers.1.attention.to_k", ("layers.1.attention.to_k.weight",)),
    LoraModule("transformer.context_refiner.0.attention.to_out.0", ("context_refiner.0.attention.to_out.0.weight",)),
]


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> LoraCase:
    def conds(comps):
        return encode_prompts(comps, "z-image", "a tiny house on a hill", "low quality")

    path = str(ensure_tiny_model("tiny-z-image"))
    latent = torch.zeros(1, 16, 8, 12)  # 4 x 6 image tokens
    return LoraCase(path, tmp_path_factory.mktemp("z-image-lora"), MODULES, conds, latent, 4.0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_on_the_workers_equals_the_merged_weights(cpu_pool, case, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pipefusion = {"patches": 2, "warmup": case.settings.steps} if layout == "pp2" else {}
    got = case.run(pool, **pipefusion)
    assert relative(got, case.merged) <= 1e-5, f"relative L2 error {relative(got, case.merged):.2e}"
    assert relative(case.plain, case.merged) > 1e-2  # the LoRA changes the image
    if layout == "ulysses2":  # an empty stack restores the weights
        assert relative(case.run(pool, loras=()), case.plain) <= 1e-5
