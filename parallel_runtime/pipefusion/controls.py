"""ControlNets under PipeFusion: what each stage adds to a patch's image tokens after the blocks it holds.

A ControlNet kind runs under PipeFusion when its runner can give the updates of *one band* of image tokens for
*some* main blocks (``band_updates``, :class:`BandControl`), computed on the stage that holds those blocks from the
band's own tokens. DiffSynth Qwen-Image model patches do: a patch block is a token-wise map of the image token and
the hint token at the same place (``models/families/qwen_image/diffsynth.py``), so a stage embeds the band's hint
tokens (``img_in``, per item) and applies its own blocks' patches, in the same order as on one device. Nothing
crosses a stage boundary for it (no residuals, no hint tokens): the hint is part of the conditioning every rank
holds. Per item and stage the extra compute is the hint embedding of the band's tokens plus one patch block per
held main block over those tokens, so over a step every stage runs each image token through its blocks' patches
exactly once (the whole image once, as on one device, split over the stages). Exact per patch: with stale K/V off
or after a full warmup the result equals one device's; with stale K/V only the main model's attention is stale.

ComfyUI's semantics stay: a chain's links apply in order, each with its strength, and only while the item's sigma
lies in its start/end window (``denoise.control.ActiveLinks``); under CFG parallel each pipeline adds its own
branch's controls. ControlNets with attention of their own over the whole image (Flux InstantX / Union, XLabs,
Mistoline, Qwen-Image InstantX and its inpainting file: runners with ``band_residuals``) run on the first stage per
patch, with stale K/V of their own, and the later stages' residuals travel with the patch: :mod:`.control_chain` says
where they run and what it costs. Other kinds are refused on the host before a job starts. Wan VACE is not
a ControlNet here: its hint blocks are part of the model and run inside the calls of the main blocks they follow,
so each stage runs those of its own blocks on the patch's control tokens, with stale K/V of their own, and the
control streams travel with the patch (``models/families/wan/vace.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from ..denoise.control import ActiveLinks, combine, hint_for_batch
from ..errors import ConfigError
from ..models.controlnet_kind import FLUX_INSTANTX, FLUX_MISTOLINE, FLUX_XLABS, QWEN_DIFFSYNTH, QWEN_INSTANTX
from ..parallel.mesh import ParallelMesh
from ..sampling import ModelSampling
from .branches import Stream
from .schedule import Band

KINDS = (QWEN_DIFFSYNTH, FLUX_INSTANTX, FLUX_XLABS, FLUX_MISTOLINE, QWEN_INSTANTX)  # kinds that run under PipeFusion
CONTROL_WITH_REFERENCES = (
    "a ControlNet together with reference images (ReferenceLatent) under PipeFusion",
    "the ControlNet's tokens line up with the image's alone; the reference tokens ride in the same sequence",
    "sample reference images (edit models) or a ControlNet, not both in one sampler",
)


class BandControl(Protocol):
    """A ControlNet runner PipeFusion can run per patch."""

    def band_updates(
        self,
        hint: torch.Tensor,
        control_type: Sequence[int],
        tokens: tuple[int, int],
        mesh: ParallelMesh,
        blocks: Sequence[int],
        num_blocks: int,
    ) -> list[Any]:
        """The update (a residual tensor, a token patch, or None) of this rank's share of the image tokens
        ``tokens`` (a range of the whole image's row-major tokens) after each main block in ``blocks``."""
        ...


def refuse_kind(name: str, kind: str) -> None:
    """A ControlNet whose kind PipeFusion does not run: what, why, fix."""
    if kind not in KINDS:
        raise ConfigError(
            f"the ControlNet {name} ({kind}) on a PipeFusion layout",
            "PipeFusion runs DiffSynth Qwen-Image model patches, Flux ControlNets (InstantX / Union, XLabs, "
            "Mistoline) and InstantX Qwen-Image ControlNets per patch, not yet this kind",
            "use Ulysses / Ring / CFG parallelism for this ControlNet (a layout without PipeFusion)",
        )


class StageControls:
    """One stage's ControlNet updates per item: each stream's active links, for the blocks this stage holds."""

    def __init__(
        self,
        runners: Mapping[str, Any],
        model_sampling: ModelSampling,
        mesh: ParallelMesh,
        blocks: Sequence[int],
        num_blocks: int,
    ):
        self.runners, self.mesh = runners, mesh
        self.blocks, self.num_blocks = list(blocks), num_blocks
        self.active = ActiveLinks(model_sampling)
        self.tokens = 0  # band tokens x batch rows run through a link's block, summed over links and blocks

    def check(self, streams: Sequence[Stream], block_cache: bool) -> None:
        """Every link's runner is loaded and runs per patch; no reference images or block cache beside it."""
        chains = [s.control for s in streams if s.control is not None]
        if not chains:
            return
        if any(s.references for s in streams):
            raise ConfigError(*CONTROL_WITH_REFERENCES)
        if block_cache:
            raise ConfigError(
                "a ControlNet with a block cache under PipeFusion",
                "the block cache reuses the middle blocks' residual; the ControlNet's per-block updates would be "
                "added to blocks that do not run",
                "remove the Parallel Block Cache node from this graph, or the ControlNet",
            )
        for chain in chains:
            for link in chain.links:
                runner = self.runners.get(link.file)
                if runner is None:
                    raise ConfigError(
                        f"the ControlNet {link.file} is not loaded on this worker",
                        "the sampling job loads every ControlNet its conditioning names before denoising",
                        "report this as a bug (the job's ControlNet list missed this file)",
                    )
                if not hasattr(runner, "band_updates") and not hasattr(runner, "band_residuals"):
                    refuse_kind(link.file, type(runner).__name__)

    def for_stream(self, stream: Stream, band: Band, sigma: float, rows: int) -> dict[int, Any]:
        """Block index -> the summed, strength-weighted update of the stream's active links at ``sigma`` on the
        band's image tokens (the stream's model call has ``rows`` batch rows); empty without ControlNets."""
        chain, entries = stream.control, len(stream.members)
        if chain is None or not self.blocks:
            return {}
        links = self.active(chain, torch.tensor(sigma, dtype=torch.float32))
        links = [link for link in links if hasattr(self.runners[link.file], "band_updates")]  # else control_chain.py
        if not links:
            return {}
        batch, tokens = rows // entries, stream.token_range(band)
        total: list[Any] | None = None
        for link in links:
            runner: BandControl = self.runners[link.file]
            hint = hint_for_batch(link.hint, batch, entries)
            out = runner.band_updates(hint, link.control_type, tokens, self.mesh, self.blocks, self.num_blocks)
            scaled = [
                None if r is None else r * link.strength if isinstance(r, torch.Tensor) else r.scaled(link.strength)
                for r in out
            ]
            total = scaled if total is None else [combine(a, b) for a, b in zip(total, scaled)]
            self.tokens += (tokens[1] - tokens[0]) * batch * entries * len(self.blocks)
        assert total is not None
        return {i: u for i, u in zip(self.blocks, total) if u is not None}
