"""The conditioning branches one PipeFusion rank evaluates per item, and how their predictions combine."""

from __future__ import annotations

import torch

from ..denoise.denoiser import can_batch, concat_conditioning, expand_conditioning
from ..models.base import Conditioning
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..sampling import cfg_combine, uses_uncond


class Branches:
    """The conditioning branches this rank's pipeline evaluates per item and how they combine."""

    def __init__(
        self, mesh: ParallelMesh, positive: Conditioning, negative: Conditioning | None, cfg: float, batch: int
    ):
        self.cfg = cfg
        self.use_uncond = uses_uncond(cfg, negative)
        positive = expand_conditioning(positive, batch)
        negative = expand_conditioning(negative, batch)
        self.mode = "single"
        self.conds: list[Conditioning] = [positive]
        if self.use_uncond:
            if mesh.size("cfg") == 2:
                self.mode = "cfg_parallel"
                self.conds = [positive if mesh.rank("cfg") == 0 else negative]
            elif can_batch(positive, negative):
                self.mode = "batched"
                self.conds = [concat_conditioning(positive, negative)]
            else:
                self.mode = "separate"
                self.conds = [positive, negative]

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x]) if self.mode == "batched" else x

    def combine(self, denoised: list[torch.Tensor], mesh: ParallelMesh) -> torch.Tensor:  # denoised per branch, float32
        if self.mode == "single":
            return denoised[0]
        if self.mode == "batched":
            cond, uncond = denoised[0].chunk(2, dim=0)
            return cfg_combine(cond, uncond, self.cfg)
        if self.mode == "separate":
            return cfg_combine(denoised[0], denoised[1], self.cfg)
        both = all_gather_cat(denoised[0].contiguous(), mesh.group("cfg"), mesh.stats, dim=0, op="cfg")
        cond, uncond = both.chunk(2, dim=0)
        return cfg_combine(cond, uncond, self.cfg)
