"""The conditioning one PipeFusion rank evaluates per item, as *streams*, and how their predictions combine.

A stream is one model call per item: the entries of the branches this rank evaluates (both, or its own under
CFG parallel) whose texts batch and whose windows and ControlNets agree run as one batch, grouped as the single-device
``Denoiser`` groups them (a plain positive and negative that batch form one stream, as before). An entry with
an area (``denoise.regions``) runs on its window of the latent; an item (a row band of the whole image, or
the whole image during warmup) runs each stream on the rows of its window inside the band and skips the
streams whose window misses the band. Each stream keeps its own stale K/V buffers (keyed by its index), sized
for its text and window tokens: entries never see each other's K/V. The last stage weighs every member's
prediction with its placement (area / mask / strength), sums them per branch over the band's pixels and
divides by the summed weights, then applies CFG, patch by patch, so the pipeline keeps flowing across steps.

Every stream runs at every step; an entry outside its timestep range weighs 0 there (a stream resumed after
steps of rest would attend over K/V that many steps old). Memory: per attention layer of a stage each stream
keeps K and V of its text and window tokens (for its batch rows), so the buffers total at most the number of
entries this rank evaluates times the one whole-image buffer of a single prompt.
"""

from __future__ import annotations

import dataclasses

import torch

from ..denoise.control import ControlChain, same_control
from ..denoise.entries import (
    COUNT_FLOOR,
    ActiveWindow,
    Branch,
    CondEntry,
    as_branch,
    can_batch,
    concat_conditioning,
    expand_branch,
)
from ..denoise.regions import Placement, pair_areas, place
from ..errors import ConfigError
from ..models.base import Conditioning
from ..models.reference_latents import reference_count, without_references
from ..parallel.collectives import all_gather_cat
from ..parallel.mesh import ParallelMesh
from ..sampling import Guided, ModelSampling, cfg_combine, uses_uncond
from .schedule import Band

REFERENCES_WITH_AREAS = (
    "reference images (ReferenceLatent) on a conditioning entry with an area under PipeFusion",
    "PipeFusion keeps the reference tokens' K/V per stream of the whole image; an area's window is not one",
    "put the reference images on an entry without ConditioningSetArea, or use a layout without PipeFusion",
)


def check_windows(entries: list[CondEntry], shape: tuple[int, ...], patch: int) -> None:
    """Area windows PipeFusion can cut into row bands: whole tokens (rows, height and width multiples of
    the patch size), as the host checks before a job starts."""
    for entry in entries:
        if entry.region is None:
            continue
        where = place(entry.region, entry.strength, shape)
        (r0, r1), (c0, c1) = where.rows, where.cols
        if r0 % patch or r1 % patch or (c1 - c0) % patch:
            px = 8 * patch
            raise ConfigError(
                f"a conditioning area of {c1 - c0}x{r1 - r0} latent pixels at x={c0}, y={r0} under PipeFusion",
                f"PipeFusion cuts every area's window into the image's row bands of whole {patch}x{patch}-pixel "
                "tokens, so its top, height and width must be whole tokens",
                f"give the area a y, height and width that are multiples of {px} px (ConditioningSetArea), or use "
                "a layout without PipeFusion (Ulysses / Ring / CFG take any area)",
            )


@dataclasses.dataclass(frozen=True, eq=False)
class Member:
    """One entry of a stream: its branch (0 positive, 1 negative), placement and timestep range."""

    branch: int
    entry: CondEntry
    placement: Placement
    active: ActiveWindow


@dataclasses.dataclass(frozen=True, eq=False)
class Stream:
    """Entries run as one batch over one window: one model call and one stale K/V state per item."""

    index: int
    members: tuple[Member, ...]
    cond: Conditioning
    guidance: torch.Tensor | None  # per batch row of the call (None for models without embedded guidance)
    rows: tuple[int, int]  # the window's latent rows
    cols: tuple[int, int]  # ... and columns
    whole: bool  # the window is the whole latent
    patch: int

    @property
    def references(self) -> int:
        """Reference-image tokens (edit models) the stream's model call appends to the image's."""
        return reference_count(self.cond)

    @property
    def control(self) -> ControlChain | None:
        """The ControlNets of the stream's entries (entries batch only with the same chain)."""
        return self.members[0].entry.control

    def cond_for(self, with_references: bool) -> Conditioning:
        """The stream's conditioning, without its reference images when the item reads their kept K/V."""
        return self.cond if with_references else without_references(self.cond)

    @property
    def tokens(self) -> int:
        """Image tokens of the window."""
        return (self.rows[1] - self.rows[0]) // self.patch * ((self.cols[1] - self.cols[0]) // self.patch)

    def overlap(self, band: Band) -> tuple[int, int] | None:
        """The latent rows the window shares with ``band`` (None when it misses the band)."""
        b0, b1 = band.latent_rows(self.patch)
        r0, r1 = max(b0, self.rows[0]), min(b1, self.rows[1])
        return (r0, r1) if r0 < r1 else None

    def token_range(self, band: Band) -> tuple[int, int]:
        """The band's tokens within the window's row-major token sequence."""
        r0, r1 = self.overlap(band) or (0, 0)
        cols = (self.cols[1] - self.cols[0]) // self.patch
        return (r0 - self.rows[0]) // self.patch * cols, (r1 - self.rows[0]) // self.patch * cols

    def input(self, x_band: torch.Tensor, band: Band) -> torch.Tensor:
        """The model call's latent: the window's part of the band's latent, once per member."""
        r0, r1 = self.overlap(band) or (0, 0)
        b0 = band.latent_rows(self.patch)[0]
        part = x_band[..., r0 - b0 : r1 - b0, self.cols[0] : self.cols[1]]
        return part if len(self.members) == 1 else torch.cat([part] * len(self.members))


class Branches:
    """The streams this rank's pipeline evaluates per item and how their predictions combine.

    ``shape`` is the model latent's [B, C, H, W] (a video's stacked view); ``guidance`` the Flux guidance of
    entries without their own (None for models without one). ``with_uncond`` (CFG++ samplers): the negative
    runs at every cfg and ``combine`` answers ``Guided(denoised, uncond)``."""

    def __init__(
        self,
        mesh: ParallelMesh,
        model_sampling: ModelSampling,
        positive: Branch | Conditioning,
        negative: Branch | Conditioning | None,
        cfg: float,
        shape: tuple[int, ...],
        patch: int,
        guidance: float | None = None,
        with_uncond: bool = False,
    ):
        self.cfg, self.with_uncond, self.shape = cfg, with_uncond, tuple(shape)
        batch = shape[0]
        pos, neg = expand_branch(as_branch(positive), batch), expand_branch(as_branch(negative), batch)
        assert pos is not None
        self.use_uncond = uses_uncond(cfg, neg) or (with_uncond and neg is not None)
        given = [list(pos)] + ([list(neg)] if neg is not None else [])
        if any(e.region is not None for b in given for e in b):
            given = pair_areas(given, (shape[-2], shape[-1]))
            check_windows([e for b in given for e in b], self.shape, patch)
        self.cfg_parallel = self.use_uncond and mesh.size("cfg") == 2
        branches = given[:2] if self.use_uncond else given[:1]
        mine = [mesh.rank("cfg")] if self.cfg_parallel else list(range(len(branches)))
        self.mine = mine
        members = [
            Member(b, e, place(e.region, e.strength, self.shape, mesh.device), ActiveWindow(e, model_sampling))
            for b in mine
            for e in branches[b]
        ]
        self.streams: list[Stream] = []
        while members:
            first = members[0]
            group = [m for m in members if _joins(m, first)]
            members = [m for m in members if not any(m is g for g in group)]
            self.streams.append(self._stream(len(self.streams), group, batch, patch, guidance, mesh.device))
        if any(s.references and not s.whole for s in self.streams):
            raise ConfigError(*REFERENCES_WITH_AREAS)

    @staticmethod
    def _stream(
        index: int, group: list[Member], batch: int, patch: int, guidance: float | None, device: torch.device
    ) -> Stream:
        rows_of = None
        if guidance is not None:
            values = [m.entry.guidance if m.entry.guidance is not None else guidance for m in group]
            rows_of = torch.tensor([float(v) for v in values for _ in range(batch)])
        where = group[0].placement
        cond = concat_conditioning(*(m.entry.cond for m in group)).to(device)
        return Stream(index, tuple(group), cond, rows_of, where.rows, where.cols, where.whole, patch)

    def streams_in(self, band: Band) -> list[Stream]:
        """The streams an item of ``band`` runs, in order."""
        return [s for s in self.streams if s.overlap(band) is not None]

    def check_bands(self, bands: list[Band]) -> None:
        """Every band runs at least one stream (an item must carry activations down the pipeline)."""
        for band in bands:
            if not self.streams_in(band):
                r0, r1 = band.latent_rows(self.streams[0].patch)
                raise ConfigError(
                    f"no conditioning entry covers latent rows {r0}:{r1} of the image under PipeFusion",
                    "each PipeFusion patch (a row band) runs the entries whose areas it touches, and this one "
                    "touches none (KSampler would predict 0 there)",
                    "add a prompt for the whole image (ConditioningCombine with a plain text encode), or fewer "
                    "PipeFusion patches",
                )

    def combine(
        self,
        outs: list[torch.Tensor],
        streams: list[Stream],
        x_band: torch.Tensor,
        band: Band,
        sigma: torch.Tensor,
        model_sampling: ModelSampling,
        mesh: ParallelMesh,
    ) -> torch.Tensor | Guided:
        """The guided prediction (float32) for the band's latent ``x_band`` from each stream's model output
        (``outs``, in ``streams`` order): each member's prediction weighed on its window, per branch."""
        b0 = band.latent_rows(streams[0].patch)[0]
        sums = {i: torch.zeros_like(x_band) for i in self.mine}
        counts = {i: torch.full_like(x_band, COUNT_FLOOR) for i in self.mine}
        for stream, out in zip(streams, outs):
            r0, r1 = stream.overlap(band) or (0, 0)
            xw = stream.input(x_band, band)
            s = sigma.reshape(1).expand(xw.shape[0]).reshape(-1, *([1] * (xw.ndim - 1)))
            preds = model_sampling.calculate_denoised(s, out.float(), xw).chunk(len(stream.members))
            for member, pred in zip(stream.members, preds):
                if sigma not in member.active:
                    continue
                weight = member.placement.weight_rows(r0 - stream.rows[0], r1 - stream.rows[0])
                window = (..., slice(r0 - b0, r1 - b0), slice(*stream.cols))
                sums[member.branch][window] += pred * weight
                counts[member.branch][window] += weight
        preds = {i: sums[i] / counts[i] for i in self.mine}
        if self.cfg_parallel:
            (mine,) = self.mine
            both = all_gather_cat(preds[mine].contiguous(), mesh.group("cfg"), mesh.stats, dim=0, op="cfg")
            cond, uncond = both.chunk(2, dim=0)
        else:
            cond, uncond = preds[0], preds.get(1)
        guided = cfg_combine(cond, uncond, self.cfg)
        if not self.with_uncond:
            return guided
        return Guided(guided, torch.zeros_like(cond) if uncond is None else uncond)


def _joins(member: Member, first: Member) -> bool:
    a, b = member.placement, first.placement
    same_window = (a.rows, a.cols) == (b.rows, b.cols)
    return (
        can_batch(member.entry.cond, first.entry.cond)
        and same_control(member.entry.control, first.entry.control)
        and same_window
    )
