"""Shared by the LoRA tests of families ComfyUI 0.3.64 lacks (no stored KSampler output to compare with): a LoRA
file written in several trainers' namings, the oracle (the model patched in process by the LoRA formula
W + strength * alpha / rank * up @ down, then our single device) and the same job on worker layouts with the file
as a LoRA stack (each rank patches what it holds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.lora.files import lora_file_id
from parallel_runtime.models.lora.patcher import StackEntry
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

RANK = 2
STRENGTH = 0.7


@dataclasses.dataclass(frozen=True)
class LoraModule:
    """A module name as a trainer writes it and the diffusers weights it patches (a fused module: rows in order);
    kohya's files say lora_down / lora_up with an alpha, the others lora_A / lora_B (no alpha: alpha = rank)."""

    name: str
    targets: tuple[str, ...]
    kohya: bool = False


def write_lora(path: Path, modules: list[LoraModule], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Write the LoRA file; return what the formula adds to each target weight at STRENGTH."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(9)
    tensors, deltas = {}, {}
    for m in modules:
        sizes = [params[t].shape[0] for t in m.targets]
        down = 0.3 * torch.randn(RANK, params[m.targets[0]].shape[1], generator=g)
        up = 0.3 * torch.randn(sum(sizes), RANK, generator=g)
        tensors[f"{m.name}.{'lora_down' if m.kohya else 'lora_A'}.weight"] = down
        tensors[f"{m.name}.{'lora_up' if m.kohya else 'lora_B'}.weight"] = up
        alpha = 1.0 if m.kohya else RANK
        if m.kohya:
            tensors[f"{m.name}.alpha"] = torch.tensor(alpha)
        for target, part in zip(m.targets, (STRENGTH * alpha / RANK * (up @ down)).split(sizes)):
            deltas[target] = deltas.get(target, 0) + part
    save_file(tensors, str(path))
    return deltas


class LoraCase:
    """A tiny model's conditioning and latent, its single-device result plain and with ``modules`` merged by the
    formula, and the LoRA file (``stack``)."""

    def __init__(self, path: str, folder: Path, modules: list[LoraModule], conds, latent: torch.Tensor, cfg: float):
        self.path, self.latent = path, latent
        self.settings = SamplingSettings(seed=5, steps=2, cfg=cfg, sampler="euler", scheduler="simple")
        comps = load_pipeline_components(path, "cpu", torch.float32)
        self.pos, self.neg = conds(comps)
        self.plain = self._single(comps)
        params = dict(comps.transformer.named_parameters())
        lora = folder / "lora.safetensors"
        deltas = write_lora(lora, modules, {k: v.detach() for k, v in params.items()})
        with torch.no_grad():
            for target, delta in deltas.items():
                params[target].add_(delta)
        self.merged = self._single(comps)
        self.stack = (StackEntry(lora_file_id(lora), STRENGTH, 0.0),)

    def _single(self, comps) -> torch.Tensor:
        adapter = comps.adapter()
        ms = model_sampling_for(adapter)
        return denoise_latent(adapter, ParallelMesh.single(), ms, self.pos, self.neg, self.latent, self.settings)

    def run(self, pool, loras=None, **pipefusion) -> torch.Tensor:
        pool.submit(load_model, self.path, "fp32", "sdpa").result(300)
        args = (self.pos, self.neg, self.latent, self.settings)
        return pool.submit(generate, *args, loras=self.stack if loras is None else loras, **pipefusion).result(600)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).norm() / b.norm())
