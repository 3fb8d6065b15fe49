"""ControlNets with attention of their own under PipeFusion: the whole chain on the first stage, per patch.

Flux InstantX / Union, XLabs and Mistoline ControlNets and Qwen-Image InstantX ControlNets (the inpainting file too)
are transformers of their own: their blocks attend over the whole image. Under PipeFusion they run like the main model, per patch, with stale K/V:

- Where: stage 0 runs every active link's ControlNet on the patch it has just embedded: the patch's image tokens
  and the band's hint tokens (the hint is part of the conditioning every rank holds), joint attention over the
  patch's fresh K/V and the other patches' K/V of the previous round, kept per link in a stale-KV cache of its own
  (:mod:`.stale_kv`, keyed by the ControlNet's blocks). Over a step each image token passes every ControlNet
  once, as on one device; with stale K/V off or after a full warmup its residuals equal one device's.
- What travels: stage 0 adds its own blocks' residuals and sends the residuals of the later stages' blocks with
  the patch (``pp_control``, a message beside the activations, same slot); stage ``s`` takes its blocks' share and
  passes the rest on. Bytes on the hop ``s -> s + 1`` per item: for each stream, (main blocks on stages after
  ``s`` that get a residual) x batch rows x this rank's image tokens of the item x hidden width x element size;
  over a step the whole image once. The ControlNet's own tokens (hidden states, text, K/V) never leave stage 0's
  ranks and are never gathered (under Ulysses each rank runs its share, as the main model's).
- What it costs: stage 0 also computes the ControlNets: its work per patch grows by theirs (a FLUX.1 Union Pro
  ControlNet, 5 double + 10 single blocks, is about a quarter of FLUX.1's 19 + 38) and the pipeline runs at the
  slowest stage's pace; every rank loads the ControlNet (the later stages never run it). The alternative, the
  ControlNet's blocks split over the stages with its hidden state travelling with the patch, is not built.

ComfyUI's semantics stay: the links of a chain in order, each with its strength and only inside its start/end
window (``denoise.control.ActiveLinks``); under CFG parallel each pipeline runs its own branch's links. A stream
on an area's window (area conditioning) with such a ControlNet is refused, as on one device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..denoise.control import ActiveLinks, ControlLink, combine, hint_for_batch
from ..errors import ConfigError
from ..models.base import Activations, Conditioning, ModelAdapter
from ..parallel.mesh import ParallelMesh
from ..parallel.stages import StagePlan
from ..sampling import ModelSampling
from .branches import Stream
from .schedule import Band
from .stale_kv import ItemTokens, StaleKVCache, run_block_stale
from .transport import ActivationFormat, FieldSpec

# a stream's model input of the band, its latent rows in the stream's latent, that latent's size, timestep, cond, guidance
StreamInput = tuple[torch.Tensor, tuple[int, int], tuple[int, ...], torch.Tensor, Conditioning, "torch.Tensor | None"]


class ChainControls:
    """One stage's side of the ControlNets that run on the first stage (runners with ``band_residuals``)."""

    def __init__(
        self,
        runners: Mapping[str, Any],
        model_sampling: ModelSampling,
        mesh: ParallelMesh,
        stages: StagePlan,
        stage: int,
        adapter: ModelAdapter,
        stale: bool,
    ):
        self.runners = {f: r for f, r in runners.items() if hasattr(r, "band_residuals")}
        self.active = ActiveLinks(model_sampling)
        self.mesh, self.stages, self.stage = mesh, stages, stage
        self.main_blocks = [adapter.block(i)[0] for i in range(adapter.num_blocks)]
        self.mine = set(stages.blocks(stage))
        self.image_tokens, self.stale, self.backend = 0, stale, "auto"  # set per run (begin)
        self.caches: dict[tuple[int, int], StaleKVCache] = {}  # (chain token, link position): its stale K/V
        self.tokens = 0  # image tokens x batch rows run through a ControlNet (stage 0), summed over links

    def begin(self, backend: str, image_tokens: int) -> None:
        """A run's attention backend and image tokens (the ControlNets' stale-KV buffers)."""
        self.backend, self.image_tokens = backend, image_tokens

    def check(self, streams: Sequence[Stream]) -> None:
        for stream in streams:
            if stream.control is not None and not stream.whole and self._links(stream, None):
                raise ConfigError(
                    "a ControlNet on an area's conditioning (ConditioningSetArea) under PipeFusion",
                    "the ControlNet's hint covers the whole latent; an area's window would need it cropped",
                    "apply the ControlNet to conditioning without an area, or use a layout without PipeFusion",
                )

    def _links(self, stream: Stream, sigma: float | None) -> list[tuple[int, ControlLink]]:
        """(position in the chain, link) of the stream's links this class runs, active at ``sigma`` (None: all)."""
        chain = stream.control
        if chain is None:
            return []
        active = chain.links if sigma is None else self.active(chain, torch.tensor(sigma, dtype=torch.float32))
        ids = {id(link) for link in active}
        return [(p, link) for p, link in enumerate(chain.links) if id(link) in ids and link.file in self.runners]

    def carried(self, stream: Stream, sigma: float, after: int) -> list[int]:
        """Main blocks on stages >= ``after`` that get a residual from the stream's active links at ``sigma``."""
        marks = [False] * len(self.main_blocks)
        for _, link in self._links(stream, sigma):
            marks = [a or b for a, b in zip(marks, self.runners[link.file].residual_blocks(self.main_blocks))]
        later = [i for s in range(after, self.stages.num_stages) for i in self.stages.blocks(s)]
        return [i for i in later if marks[i]]

    # -- stage 0 ---------------------------------------------------------------------------------
    def first_stage(
        self,
        streams: Sequence[Stream],
        band: Band,
        sigma: float,
        inputs: Sequence[StreamInput],
        acts: list[Activations],
    ) -> tuple[list[dict[int, torch.Tensor]], torch.Tensor | None]:
        """Run the streams' active ControlNets on the band: (per stream, this stage's blocks' residuals; the
        later stages' residuals as one flat tensor, or None when there are none)."""
        own: list[dict[int, torch.Tensor]] = []
        out: list[torch.Tensor] = []
        for stream, stream_input, a in zip(streams, inputs, acts):
            total = self._residuals(stream, band, sigma, stream_input)
            own.append({i: r for i, r in enumerate(total or []) if i in self.mine and r is not None})
            for i in self.carried(stream, sigma, self.stage + 1):
                assert total is not None and total[i] is not None, f"ControlNet residual of block {i} missing"
                out.append(total[i].to(a.img.dtype).reshape(-1))
        return own, (torch.cat(out) if out else None)

    def _residuals(
        self,
        stream: Stream,
        band: Band,
        sigma: float,
        stream_input: StreamInput,
    ) -> list[Any] | None:
        links = self._links(stream, sigma)
        if not links:
            return None
        x_in, rows, size, timestep, cond, guidance = stream_input
        entries = len(stream.members)
        tokens = stream.token_range(band)
        total: list[Any] | None = None
        for position, link in links:
            key = (stream.control.token if stream.control is not None else 0, position)
            cache = self.caches.setdefault(key, StaleKVCache(self.mesh, self.image_tokens, self.backend, self.stale))

            def run(blocks: ModelAdapter, acts: Activations, i: int, cache: StaleKVCache = cache) -> Activations:
                cache.begin_item(ItemTokens(stream.index, tokens, acts.txt_tokens, stream.tokens))
                return run_block_stale(blocks, acts, i, cache)

            hint = hint_for_batch(link.hint, x_in.shape[0] // entries, entries)
            runner = self.runners[link.file]
            out = runner.band_residuals(
                x_in, rows, size, timestep, cond, guidance, hint, link.control_type, self.mesh, run, self.main_blocks
            )
            scaled = [None if r is None else r * link.strength for r in out]
            total = scaled if total is None else [combine(a, b) for a, b in zip(total, scaled)]
            self.tokens += (tokens[1] - tokens[0]) * x_in.shape[0]
        return total

    # -- the later stages -------------------------------------------------------------------------
    def incoming(self, streams: Sequence[Stream], sigma: float, fmt: ActivationFormat) -> torch.Tensor | None:
        """A receive buffer for an item's residuals of this and later stages' blocks (``fmt``: the band's
        activation format), or None when none come."""
        img = image_specs(fmt)
        numel = sum(len(self.carried(s, sigma, self.stage)) * spec.numel for s, spec in zip(streams, img))
        return None if not numel else torch.empty(numel, dtype=img[0].torch_dtype, device=self.mesh.device)

    def follow(
        self, streams: Sequence[Stream], sigma: float, flat: torch.Tensor | None, fmt: ActivationFormat
    ) -> tuple[list[dict[int, torch.Tensor]], torch.Tensor | None]:
        """(per stream, this stage's blocks' residuals from the received ``flat``; what to pass on, or None)."""
        img = image_specs(fmt)
        own: list[dict[int, torch.Tensor]] = []
        rest: list[torch.Tensor] = []
        at = 0
        for stream, spec in zip(streams, img):
            mine: dict[int, torch.Tensor] = {}
            for i in self.carried(stream, sigma, self.stage):
                assert flat is not None
                piece = flat[at : at + spec.numel]
                at += spec.numel
                if i in self.mine:
                    mine[i] = piece.view(spec.shape)
                else:
                    rest.append(piece)
            own.append(mine)
        return own, (torch.cat(rest) if rest else None)


def image_specs(fmt: ActivationFormat) -> list[FieldSpec]:
    """Each stream's image tokens in an activation format, streams in order."""
    return [f for f in fmt.fields if f.name == "img"]
