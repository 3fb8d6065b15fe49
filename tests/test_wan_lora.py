"""A LoRA on a two-expert Wan 2.2 A14B model (a diffusers folder: both experts in one loaded model) patches
both experts, as ComfyUI does when the same LoraLoaderModelOnly feeds each expert's model: on Ulysses 2 the
result equals one device with both experts patched by the LoRA formula (W + strength * up @ down), and
differs from patching the high-noise expert alone; an empty stack restores both."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.denoise.loop import denoise_latent
from parallel_runtime.denoise.model_sampling import model_sampling_for
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.lora.files import lora_file_id
from parallel_runtime.models.lora.patcher import StackEntry
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

STRENGTH = 0.7
TARGETS = {"blocks.0.attn1.to_q": (64, 64), "blocks.1.ffn.net.0.proj": (96, 64), "blocks.1.attn2.to_v": (64, 64)}


def _factors(rank: int = 4) -> dict[str, torch.Tensor]:
    """PEFT-named LoRA factors (no alpha: ComfyUI's scale 1) for the TARGETS."""
    g = torch.Generator().manual_seed(11)
    out = {}
    for name, (rows, cols) in TARGETS.items():
        out[f"transformer.{name}.lora_A.weight"] = 0.3 * torch.randn(rank, cols, generator=g)
        out[f"transformer.{name}.lora_B.weight"] = 0.3 * torch.randn(rows, rank, generator=g)
    return out


def _patch(transformer: torch.nn.Module, factors: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name in TARGETS:
            up, down = factors[f"transformer.{name}.lora_B.weight"], factors[f"transformer.{name}.lora_A.weight"]
            transformer.get_parameter(f"{name}.weight").add_(STRENGTH * (up @ down))


def _one_device(path: str, factors: dict[str, torch.Tensor] | None, both: bool, latent, settings) -> tuple:
    comps = load_pipeline_components(path, "cpu", torch.float32)
    if factors is not None:
        _patch(comps.transformer, factors)
        if both:
            _patch(comps.transformer_2, factors)
    adapter = comps.adapter()
    pos, neg = encode_prompts(comps, "wan", "a paper boat drifting down a gutter", "static, blurry")
    return denoise_latent(
        adapter,
        ParallelMesh.single(),
        model_sampling_for(adapter),
        Conditioning(pos.prompt_embeds),
        Conditioning(neg.prompt_embeds),
        latent,
        settings,
        expert_2=comps.second_expert(),
    ), (Conditioning(pos.prompt_embeds), Conditioning(neg.prompt_embeds))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_lora_patches_both_experts_of_a_two_expert_model(cpu_pool, tmp_path):
    path = str(ensure_tiny_model("tiny-wan-a14b"))
    factors = _factors()
    lora_path = tmp_path / "wan_both_experts_lora.safetensors"
    save_file(factors, str(lora_path))
    latent = torch.zeros(1, 16, 3, 6, 10)
    settings = SamplingSettings(seed=5, steps=4, cfg=4.0, sampler="euler", scheduler="simple")
    both, (pos, neg) = _one_device(path, factors, True, latent, settings)
    first_only, _ = _one_device(path, factors, False, latent, settings)
    plain, _ = _one_device(path, None, False, latent, settings)
    assert _rel(first_only, both) > 1e-3 and _rel(plain, both) > 1e-3  # the second expert's patch matters

    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, path, "fp32", "sdpa").result(300)
    stack = (StackEntry(lora_file_id(lora_path), STRENGTH),)
    got = pool.submit(generate, pos, neg, latent, settings, loras=stack).result(600)
    assert _rel(got, both) <= 1e-5, f"relative L2 difference {_rel(got, both):.2e} from both experts patched"
    restored = pool.submit(generate, pos, neg, latent, settings, loras=()).result(600)
    assert _rel(restored, plain) <= 1e-5
