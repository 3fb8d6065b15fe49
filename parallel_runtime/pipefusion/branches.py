"""The conditioning branches one PipeFusion rank evaluates per item, and how their predictions combine."""

from __future__ import annotations

import torch

from ..denoise.entries import Branch, CondEntry, as_branch, can_batch, concat_conditioning, expand_branch
from ..errors import ConfigError
from ..models.base import Conditioning
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..sampling import Guided, cfg_combine, uses_uncond


def single_entry(branch: Branch | None, role: str) -> CondEntry | None:
    """The one plain entry PipeFusion runs per branch (its stale K/V buffers hold one text per branch)."""
    if branch is None:
        return None
    if any(entry.control is not None for entry in branch):
        raise ConfigError(
            f"the {role} conditioning carries a ControlNet on a PipeFusion layout",
            "PipeFusion runs the model patch by patch with stale activations; the ControlNet's residuals are "
            "not computed per patch",
            "use Ulysses / Ring / CFG parallelism for ControlNet graphs (a layout without PipeFusion)",
        )
    if len(branch) != 1 or not branch[0].is_plain:
        raise ConfigError(
            f"the {role} conditioning has {len(branch)} entries or a strength / timestep range",
            "PipeFusion keeps one stale K/V buffer per branch, so it runs exactly one text per branch at every "
            "step; several entries (Conditioning Combine) or ranges (ConditioningSetTimestepRange) would change "
            "which texts run from step to step",
            "use a layout without PipeFusion (Ulysses / Ring / CFG keep KSampler's semantics), or a single entry "
            "per branch (Conditioning Concat joins prompts into one entry)",
        )
    return branch[0]


class Branches:
    """The conditioning branches this rank's pipeline evaluates per item and how they combine.

    ``guidance`` is the Flux guidance of entries without their own (None for models without one);
    each branch keeps its entry's guidance (FluxGuidance on the negative included). ``with_uncond``
    (CFG++ samplers): the negative runs at every cfg and ``combine`` answers ``Guided(denoised, uncond)``."""

    def __init__(
        self,
        mesh: ParallelMesh,
        positive: Branch | Conditioning,
        negative: Branch | Conditioning | None,
        cfg: float,
        batch: int,
        guidance: float | None = None,
        with_uncond: bool = False,
    ):
        self.cfg, self.with_uncond = cfg, with_uncond
        negative = as_branch(negative)
        self.use_uncond = uses_uncond(cfg, negative) or (with_uncond and negative is not None)
        pos = single_entry(expand_branch(as_branch(positive), batch), "positive")
        neg = single_entry(expand_branch(negative, batch), "negative") if self.use_uncond else None
        assert pos is not None

        def rows(entry: CondEntry) -> torch.Tensor | None:
            if guidance is None:
                return None
            return torch.full((batch,), float(entry.guidance if entry.guidance is not None else guidance))

        self.mode = "single"
        self.conds: list[Conditioning] = [pos.cond]
        self.guidance: list[torch.Tensor | None] = [rows(pos)]
        if self.use_uncond:
            assert neg is not None
            if mesh.size("cfg") == 2:
                self.mode = "cfg_parallel"
                mine = pos if mesh.rank("cfg") == 0 else neg
                self.conds, self.guidance = [mine.cond], [rows(mine)]
            elif can_batch(pos.cond, neg.cond):
                self.mode = "batched"
                self.conds = [concat_conditioning(pos.cond, neg.cond)]
                both = (rows(pos), rows(neg))
                self.guidance = [None if both[0] is None else torch.cat(both)]
            else:
                self.mode = "separate"
                self.conds, self.guidance = [pos.cond, neg.cond], [rows(pos), rows(neg)]

    def model_input(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x]) if self.mode == "batched" else x

    def combine(self, denoised: list[torch.Tensor], mesh: ParallelMesh) -> torch.Tensor | Guided:
        """The guided prediction from each branch's (float32), with the unconditional one when asked."""
        if self.mode == "single":
            cond, uncond = denoised[0], None
        elif self.mode == "batched":
            cond, uncond = denoised[0].chunk(2, dim=0)
        elif self.mode == "separate":
            cond, uncond = denoised
        else:
            both = all_gather_cat(denoised[0].contiguous(), mesh.group("cfg"), mesh.stats, dim=0, op="cfg")
            cond, uncond = both.chunk(2, dim=0)
        guided = cfg_combine(cond, uncond, self.cfg)
        if not self.with_uncond:
            return guided
        return Guided(guided, torch.zeros_like(cond) if uncond is None else uncond)
