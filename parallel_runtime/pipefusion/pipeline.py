"""PipeFusion: patch-level pipeline parallelism over transformer blocks, with stale K/V.

Roles on the "pp" dimension of the mesh (each stage may itself be a group of sp ranks, and the
whole pipeline exists once per cfg rank):

- every stage runs its contiguous range of blocks (:mod:`..parallel.stages`, loaded by :mod:`.stage_loading`), with a stale-KV
  buffer per attention layer (:mod:`.stale_kv`);
- stage 0 embeds each item (the whole image during warmup, else one patch = row band);
- the last stage applies the output layer, CFG and the sampler step. It holds one sampler
  generator per patch (``sampling.sampler_steps``; noise from one ``SharedNoise`` draw), so every
  sampler works, heun's two evaluations per step included, and sends each patch's next latent
  straight back to stage 0: the pipeline fills once per generation, not once per step.

Items flow stage to stage point to point following a lockstep schedule every rank computes for
itself (:mod:`.schedule`). Sends are non-blocking; each receive is posted ahead, at the
start of the slot in which its sender computes the item, so the transfer overlaps compute and the
receiver finds the data waiting one slot later. Once per sampling step (at the end of the slot in
which the last stage finishes the step's last patch) all ranks join one tiny all-reduce that agrees
on cancel: a cancel ends the job within one step on every rank, and since every posted receive then
has its send, nothing is left in flight for the next job. Every point-to-point wait has a timeout;
messages carry a per-generation tag. Warmup steps (``warmup``) run synchronously on the whole image
through the same stages, which fills the K/V buffers; with ``warmup >= steps`` the result equals the
single-device denoise loop's (:func:`parallel_runtime.denoise.loop.denoise_latent`).

Reference images (edit models) ride with the image, run once per step by each stage (:mod:`.references`).
ControlNets that are model patches (DiffSynth) run on each stage after its own blocks, on the patch's tokens
(:mod:`.controls`); ControlNets with attention of their own run on stage 0 per patch, their later residuals sent with
the patch (:mod:`.control_chain`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..denoise.caching.decisions import DecisionGroup
from ..denoise.control import apply_update, combine
from ..denoise.entries import Branch
from ..denoise.loop import latent_to_model, prepare_denoise_mask, schedule
from ..denoise.settings import SamplingSettings, embedded_guidance
from ..errors import ConfigError, JobCancelled
from ..models.base import Activations, Conditioning, ModelAdapter
from ..models.token_grid import stacked, unstacked
from ..parallel.collectives import PendingP2P, recv_object, recv_start, send_object, send_start
from ..parallel.mesh import ParallelMesh
from ..parallel.stages import StagePlan
from ..sampling import Guided, ModelSampling, final_sigma, sampler_spec
from .block_cache_stage import STEP_CACHE_UNDER_PIPEFUSION, StageBlockCache
from .branches import Branches
from .control_chain import ChainControls
from .controls import StageControls
from .patch_samplers import PatchSamplers
from .references import carries_references, check_references
from .run_settings import PipeFusionSettings, PipeFusionStats
from .schedule import Band, Item, PipelineSchedule, build_schedule, default_patches, receive_plan, sampler_rounds
from .stale_kv import ItemTokens, StaleKVCache, run_block_stale
from .transport import ActivationFormat

log = logging.getLogger(__name__)

StepReport = Callable[[int, int, torch.Tensor], None]  # (step, total, denoised of the whole latent)
PatchReport = Callable[[int, int, "int | None", int], None]  # (steps done here, total, patch or None, patches)


def run_pipefusion(
    adapter: ModelAdapter,
    mesh: ParallelMesh,
    stages: StagePlan,
    model_sampling: ModelSampling,
    positive: Branch | Conditioning,
    negative: Branch | Conditioning | None,
    latent_raw: torch.Tensor,
    settings: SamplingSettings,
    options: PipeFusionSettings,
    *,
    attention_backend: str = "auto",
    check_cancel: Callable[[], None] | None = None,
    on_step: StepReport | None = None,
    on_patch: PatchReport | None = None,
    message_tag: int = 1,
    cancel_points: Callable[[], None] | None = None,
    noise_mask: torch.Tensor | None = None,
    controls: Mapping[str, Any] | None = None,
) -> tuple[torch.Tensor | None, PipeFusionStats]:
    """KSampler on a raw VAE latent with PipeFusion over the mesh's "pp" dimension.

    Every rank of the mesh calls it with the same arguments. Returns (the raw latent on global
    rank 0, else None; this rank's stats). ``check_cancel`` is called by every rank once before
    the first slot and once per sampling step (it must be collective over all ranks, like
    ``JobContext.check_cancel``); ``on_step`` only on the reporting rank (last stage, cfg 0, sp 0),
    once per step; ``on_patch`` on every rank after each patch it processed, with the steps this
    rank has finished (progress per rank). ``message_tag`` (equal on all
    ranks, different for every generation, e.g. the job id) keeps one generation's point-to-point
    messages apart from another's, should an error have left a receive posted. ``cancel_points`` (also
    collective, e.g. ``runtime.cancel_points.BlockCancel``) is called by every rank after each other slot:
    a cancel then takes effect inside a step. ``noise_mask``: the LATENT's (Wan22ImageToVideoLatent keeps the
    first frame): the last stage applies it to each band as the single-device loop does, and stage 0 gives
    the model the timesteps it implies (Wan 2.2 TI2V: one per frame). ``controls``: the loaded ControlNet
    runners by file, for the entries' ControlNet chains (kinds that run per patch, :mod:`.controls`)."""
    runner = Pipeline(
        adapter, mesh, stages, model_sampling, positive, negative, latent_raw, settings, options, message_tag,
        controls,
    )  # fmt: skip
    runner.set_noise_mask(noise_mask)
    return runner.run(attention_backend, check_cancel, on_step, on_patch, cancel_points)


class Pipeline:
    """One generation on one rank (created per call: no state survives between generations)."""

    def __init__(
        self,
        adapter: ModelAdapter,
        mesh: ParallelMesh,
        stages: StagePlan,
        ms: ModelSampling,
        positive: Branch | Conditioning,
        negative: Branch | Conditioning | None,
        latent_raw: torch.Tensor,
        settings: SamplingSettings,
        options: PipeFusionSettings,
        message_tag: int,
        controls: Mapping[str, Any] | None = None,
    ):
        self.adapter, self.mesh, self.stages, self.ms = adapter, mesh, stages, ms
        self.settings, self.options = settings, options
        self.pp, self.stage = mesh.size("pp"), mesh.rank("pp")
        options.check(stages.num_stages, self.pp)
        if settings.step_cache is not None:
            raise ConfigError(*STEP_CACHE_UNDER_PIPEFUSION)
        self.first, self.last = self.stage == 0, self.stage == self.pp - 1
        self.group = mesh.group("pp")
        self.device = mesh.device
        self.timeout = options.timeout_s
        self.tags = {kind: message_tag * 8 + i for i, kind in enumerate(("setup", "act", "latent", "final", "control"))}
        self.fmt = adapter.plan.latent_format
        self.latent_raw = latent_raw
        self.batch = latent_raw.shape[0]
        self.sigmas = schedule(ms, settings)
        latent = latent_to_model(self.fmt, latent_raw)
        grid = adapter.grid_of(latent)  # raises for sizes that do not form patches
        # A video latent runs as its stacked view [B, C, T*H, W]: a band of its token rows is a contiguous
        # range of the token sequence, so patches, samplers and stale K/V work as for an image.
        self.full_size = tuple(latent.shape[2:])
        self.latent = stacked(latent)
        self.rows, self.cols = math.prod(grid[:-1]), grid[-1]
        self.size = tuple(self.latent.shape[-2:])
        self.patches = options.patches or default_patches(self.pp, self.rows)
        guidance = embedded_guidance(adapter, settings.guidance)
        with_uncond = sampler_spec(settings.sampler).cfg_pp
        self.branches = Branches(
            mesh, ms, positive, negative, settings.cfg, tuple(self.latent.shape), adapter.plan.patch_size,
            guidance, with_uncond,
        )  # fmt: skip
        self.sched: PipelineSchedule | None = None
        if self.sigmas.numel() >= 2:
            rounds = sampler_rounds(settings.sampler, self.sigmas, ms, settings.eta, settings.s_noise)
            self.sched = build_schedule(rounds, (self.rows, self.cols), self.patches, self.pp, options.warmup)
            self.branches.check_bands(self._bands_used())
        if any(stream.references for stream in self.branches.streams):
            check_references(settings, options, self.sigmas)
        self.reference_tokens = 0  # reference tokens this stage ran through its blocks (stats)
        self.controls = StageControls(controls or {}, ms, mesh, stages.blocks(self.stage), adapter.num_blocks)
        self.controls.check(self.branches.streams, settings.block_cache is not None)
        self.chain = ChainControls(controls or {}, ms, mesh, stages, self.stage, adapter, options.stale_kv)
        self.chain.check(self.branches.streams)
        self.joint = adapter.plan.text_attention == "joint"
        self.text_tokens: dict[int, int] = {}  # per stream
        self.reporter = self.last and mesh.rank("cfg") == 0 and mesh.rank("sp") == 0
        self.cache: StaleKVCache | None = None
        self.block_cache: StageBlockCache | None = None
        if settings.block_cache is not None:
            block_cache = (settings.block_cache, DecisionGroup(mesh), stages, self.stage, adapter.num_blocks)
            self.block_cache = StageBlockCache(*block_cache)
        self.sends: list[PendingP2P] = []
        self.inbox: dict[tuple[str, int], list[PendingP2P]] = {}
        self.final_latent: torch.Tensor | None = None
        self.sent_formats: dict[str, ActivationFormat] = {}  # per band: what this stage sends the next one
        self.last_item_of_step: dict[int, int] = {}
        self.seconds = dict.fromkeys(("compute", "receive", "agree", "total"), 0.0)
        self.agreements = 0
        self.mask: torch.Tensor | None = None  # the noise mask at the latent's (unstacked) shape

    def set_noise_mask(self, noise_mask: torch.Tensor | None) -> None:
        """A LATENT's noise mask, prepared as the single-device loop prepares it (1 = denoise)."""
        if noise_mask is not None:
            shape = (self.batch, self.latent.shape[1], *self.full_size)
            self.mask = prepare_denoise_mask(noise_mask, shape).to(self.device)

    # -- driver ------------------------------------------------------------------------------------
    def run(
        self,
        backend: str,
        check_cancel: Callable[[], None] | None,
        on_step: StepReport | None,
        on_patch: PatchReport | None = None,
        cancel_points: Callable[[], None] | None = None,
    ) -> tuple[torch.Tensor | None, PipeFusionStats]:
        sched = self.sched
        if sched is None:  # nothing to sample
            out = self.latent_raw.clone() if self.mesh.global_rank == 0 else None
            return out, self._stats(0)
        check = check_cancel or (lambda: None)
        start = time.perf_counter()
        self.cache = StaleKVCache(self.mesh, self.rows * self.cols, backend, stale=self.options.stale_kv)
        self.chain.begin(backend, self.rows * self.cols)
        agree_at = set(range(sched.num_slots)) if self.options.agree_cancel_every == "slot" else sched.step_end_slots()
        what = (self.stage, self.pp, self.stages.describe(), self.patches, self.options.warmup)
        items = (len(sched.stage_items(self.stage)), sched.num_slots)
        log.debug("PipeFusion stage %d/%d: blocks %s, %d patches, warmup %d, %d items in %d slots", *what, *items)
        with torch.no_grad():
            formats = self._setup()
            samplers = self._patch_samplers(sched) if self.last else None
            posts = receive_plan(sched, self.stage)
            if samplers is not None:
                samplers.send_initial()
            for k in posts.get(-1, []):
                self._post(k, formats)
            statics = {key: fmt.static_on(self.device) for key, fmt in formats.items()}
            try:
                check()
                self.agreements += 1
                for t in range(sched.num_slots):
                    for k in posts.get(t, []):
                        self._post(k, formats)
                    k = sched.slots[self.stage][t]
                    if k is not None:
                        t0 = time.perf_counter()
                        self._process(sched.items[k], formats, statics, samplers, on_step)
                        if on_patch is not None:
                            self._report_patch(sched.items[k], on_patch)
                        self.seconds["compute"] += time.perf_counter() - t0
                    self.sends = [h for h in self.sends if not h.done()]
                    if t in agree_at:
                        t0 = time.perf_counter()
                        check()
                        self.seconds["agree"] += time.perf_counter() - t0
                        self.agreements += 1
                    elif cancel_points is not None:
                        t0 = time.perf_counter()
                        cancel_points()
                        self.seconds["agree"] += time.perf_counter() - t0
            except JobCancelled:
                self._drain()  # every message posted so far has its partner: nothing is left in flight
                raise
            self._drain()
            if samplers is not None:
                self.final_latent = samplers.final()
            result = self._final_result()
        self.seconds["total"] = time.perf_counter() - start
        return result, self._stats(sched.num_slots)

    def _stats(self, slots: int) -> PipeFusionStats:
        sched = self.sched
        return PipeFusionStats(
            stage=self.stage,
            patches=self.patches,
            items=0 if sched is None else len(sched.stage_items(self.stage)),
            slots=slots,
            bubble_fraction=0.0 if sched is None else sched.bubble_fraction(),
            sent_bytes=self.mesh.stats.snapshot(),
            kv_buffer_bytes=0 if self.cache is None else self.cache.buffer_bytes,
            reference_tokens=self.reference_tokens,
            control_tokens=self.controls.tokens,
            chain_tokens=self.chain.tokens,
            seconds=dict(self.seconds),
            agreements=self.agreements,
            cache=[] if self.block_cache is None else [self.block_cache.summary()],
        )

    def _patch_samplers(self, sched: PipelineSchedule) -> PatchSamplers:
        return PatchSamplers(
            sched,
            self.settings,
            self.ms,
            self.sigmas,
            self.latent,
            self.adapter.plan.patch_size,
            self.device,
            lambda x: self._send(x, 0, "latent"),
            mask=None if self.mask is None else stacked(self.mask),
            clean_fill=self.adapter.plan.inpaint_with_clean_latent,
        )

    # -- messages ----------------------------------------------------------------------------------
    def _post(self, k: int, formats: dict[str, ActivationFormat]) -> None:
        assert self.sched is not None
        band, sigma = self.sched.items[k].band, self.sched.rounds[self.sched.items[k].round].sigma
        if self.first:
            buf = torch.empty(self._band_shape(band), dtype=torch.float32, device=self.device)
            self.inbox[("latent", k)] = [recv_start(buf, self.pp - 1, self.group, "pp_latent", self.tags["latent"])]
        else:
            bufs = formats[band.key].empty(self.device)
            self.inbox[("act", k)] = [
                recv_start(b, self.stage - 1, self.group, "pp_act", self.tags["act"]) for b in bufs
            ]
            buf = self.chain.incoming(self.branches.streams_in(band), sigma, formats[band.key])
            if buf is not None:  # the residuals of the ControlNets stage 0 ran (control_chain.py)
                buf = recv_start(buf, self.stage - 1, self.group, "pp_control", self.tags["control"])
                self.inbox[("control", k)] = [buf]

    def _take(self, kind: str, k: int) -> list[torch.Tensor]:
        t0 = time.perf_counter()
        out = [h.wait(self.timeout) for h in self.inbox.pop((kind, k))]
        self.seconds["receive"] += time.perf_counter() - t0
        return out

    def _send(self, tensor: torch.Tensor, peer: int, kind: str) -> None:
        self.sends.append(send_start(tensor, peer, self.group, self.mesh.stats, f"pp_{kind}", self.tags[kind]))

    def _drain(self) -> None:
        for handles in self.inbox.values():
            for h in handles:
                h.wait(self.timeout)
        self.inbox.clear()
        for h in self.sends:
            h.wait(self.timeout)
        self.sends.clear()

    # -- setup: activation formats stage to stage ---------------------------------------------------------
    def _bands_used(self) -> list[Band]:
        assert self.sched is not None
        used: dict[str, Band] = {}
        for item in self.sched.items:
            used.setdefault(item.band.key, item.band)
        return list(used.values())

    def _setup(self) -> dict[str, ActivationFormat]:
        """Stage 0 embeds a zero latent of every band once to learn the activation formats (shapes of the dynamic
        fields, the static fields); they travel down the pipeline once."""
        if self.first:
            sigma = self.sigmas[0]
            formats = {}
            for band in self._bands_used():
                acts = self._embed(band, torch.zeros(self._band_shape(band)), sigma)
                flags = 0 if self.block_cache is None else 1
                formats[band.key] = ActivationFormat.from_activations(acts, self.adapter.plan.text_attention, flags)
        else:
            wire = recv_object(self.stage - 1, self.group, self.device, "pp_setup", self.tags["setup"], self.timeout)
            formats = {k: ActivationFormat.from_wire(v) for k, v in wire.items()}  # type: ignore[union-attr]
        if not self.last:  # what this stage sends: less the fields its blocks were the last to read
            spent = getattr(self.adapter, "spent_fields", lambda stop: ())(self.stages.bounds[self.stage + 1])
            self.sent_formats = {k: v.without(spent) for k, v in formats.items()}
            wire = {k: v.to_wire() for k, v in self.sent_formats.items()}
            to = (self.stage + 1, self.group, self.mesh.stats, self.device, "pp_setup", self.tags["setup"])
            send_object(wire, *to, self.timeout)
        for band in self._bands_used():
            for stream, static in zip(self.branches.streams_in(band), formats[band.key].static):
                self.text_tokens.setdefault(stream.index, static["txt_tokens"] if self.joint else 0)
        sp = self.mesh.size("sp")
        if self.joint and sp > 1 and min(self.text_tokens.values()) < sp:
            raise ConfigError(
                f"{min(self.text_tokens.values())} text tokens split over {sp} sequence-parallel ranks inside a PipeFusion stage",
                "stale-KV joint attention tells text from image tokens on every rank, which needs text on every rank",
                f"encode the prompt to at least {sp} tokens, or lower ulysses x ring",
            )
        return formats

    def _band_shape(self, band: Band) -> tuple[int, ...]:
        r0, r1 = band.latent_rows(self.adapter.plan.patch_size)
        return (self.batch, self.latent.shape[1], r1 - r0, self.size[1])

    # -- per-item work -----------------------------------------------------------------------------
    def _process(
        self,
        item: Item,
        formats: dict[str, ActivationFormat],
        statics: dict[str, list[dict[str, Any]]],
        samplers: PatchSamplers | None,
        on_step: StepReport | None,
    ) -> None:
        assert self.sched is not None
        rnd = self.sched.rounds[item.round]
        fmt, reuse, streams = formats[item.band.key], None, self.branches.streams_in(item.band)
        if self.first:
            (x,) = self._take("latent", item.index)
            acts = self._embed(item.band, x, torch.tensor(rnd.sigma), inputs := [])
            own, onward = self.chain.first_stage(streams, item.band, rnd.sigma, inputs, acts)
        else:
            flats = self._take("act", item.index)
            acts = fmt.unpack(flats, statics[item.band.key])
            reuse = bool(fmt.unpack_flags(flats)[0]) if fmt.flags else None
            (received,) = self._take("control", item.index) if ("control", item.index) in self.inbox else (None,)
            own, onward = self.chain.follow(streams, rnd.sigma, received, fmt)
        acts, reuse = self._run_blocks(item, acts, reuse, own)
        if not self.last:
            fmt = self.sent_formats[item.band.key]
            for flat in fmt.pack(acts, [float(reuse)] if fmt.flags else ()):
                self._send(flat, self.stage + 1, "act")
            if onward is not None:
                self._send(onward, self.stage + 1, "control")
            return
        assert samplers is not None
        denoised = self._denoise(item, acts, samplers.x_of(item))
        samplers.step(item, denoised)
        if self.reporter and on_step is not None and samplers.last_of_step[rnd.step] == item.index:
            on_step(rnd.step, len(self.sigmas) - 1, samplers.preview)

    def _report_patch(self, item: Item, on_patch: PatchReport) -> None:
        assert self.sched is not None
        if not self.last_item_of_step:  # the same on every stage: each processes every item in order
            for other in self.sched.items:
                self.last_item_of_step[self.sched.rounds[other.round].step] = other.index
        step = self.sched.rounds[item.round].step
        done = step + 1 if item.index == self.last_item_of_step[step] else step
        on_patch(done, len(self.sigmas) - 1, item.band.index, self.patches)

    def _embed(self, band: Band, x: torch.Tensor, sigma: torch.Tensor, inputs: list | None = None) -> list[Activations]:
        """The band's embeddings for each stream whose window it touches (the window's part); ``inputs``: theirs."""
        out = []
        x = x.to(self.device).float()
        with_refs = carries_references(band, self.options)
        for stream in self.branches.streams_in(band):
            xb = stream.input(x, band)
            sigma_b = torch.as_tensor(sigma, dtype=torch.float32, device=self.device).reshape(1).expand(xb.shape[0])
            x_in = self.ms.calculate_input(sigma_b.reshape(-1, 1, 1, 1), xb)
            timestep = plain = self.ms.timestep(sigma_b)
            if self.mask is not None:  # the window's mask: a band is embedded within its window
                mask = self.mask
                if not stream.whole:
                    mask = mask[..., stream.rows[0] : stream.rows[1], stream.cols[0] : stream.cols[1]]
                mask = mask.repeat(xb.shape[0] // mask.shape[0], *([1] * (mask.ndim - 1)))
                timestep = self.adapter.process_timestep(timestep, mask)
            r0, r1 = stream.overlap(band) or (0, 0)
            rows = (r0 - stream.rows[0], r1 - stream.rows[0])
            size = (
                self.full_size if stream.whole else (stream.rows[1] - stream.rows[0], stream.cols[1] - stream.cols[0])
            )
            out.append(
                self.adapter.embed_rows(
                    x_in, rows, size, timestep, stream.cond_for(with_refs), self.mesh, guidance=stream.guidance
                )
            )
            if inputs is not None:
                inputs.append((x_in, rows, size, plain, stream.cond_for(with_refs), stream.guidance))
        return out

    def _run_blocks(
        self, item: Item, acts: list[Activations], reuse: bool | None, residuals: list[dict[int, torch.Tensor]]
    ) -> tuple[list[Activations], bool | None]:
        """This stage's blocks for each branch; with a block cache, its decision (taken or received) too."""
        cache = self.cache
        assert cache is not None

        streams = self.branches.streams_in(item.band)
        with_refs = carries_references(item.band, self.options)
        if with_refs:
            self.reference_tokens += sum(s.references for s in streams) * len(self.stages.blocks(self.stage))

        def run_block(a: Activations, i: int, position: int) -> Activations:
            stream = streams[position]
            text = self.text_tokens[stream.index]
            tokens = ItemTokens(
                stream.index, stream.token_range(item.band), text, stream.tokens, stream.references, with_refs
            )
            cache.begin_item(tokens)
            return run_block_stale(self.adapter, a, i, cache)

        if self.block_cache is not None:
            return self.block_cache.run(self.adapter, item.band.key, acts, run_block, reuse)
        out, sigma = [], self.sched.rounds[item.round].sigma if self.sched is not None else 0.0
        for b, a in enumerate(acts):
            updates = self.controls.for_stream(streams[b], item.band, sigma, a.img.shape[0])
            for i, r in residuals[b].items():  # the ControlNets stage 0 ran: their residuals for these blocks
                updates[i] = combine(updates.get(i), r)
            for i in self.stages.blocks(self.stage):
                a = run_block(a, i, b)
                if i in updates:
                    a = a.replace(img=apply_update(a.img, updates[i]))
            out.append(a)
        return out, None

    def _denoise(self, item: Item, acts: list[Activations], x: torch.Tensor) -> torch.Tensor | Guided:
        assert self.sched is not None
        sigma = torch.tensor(self.sched.rounds[item.round].sigma, dtype=torch.float32, device=self.device)
        outs = [self.adapter.final(a, self.mesh) for a in acts]
        streams = self.branches.streams_in(item.band)
        return self.branches.combine(outs, streams, x, item.band, sigma, self.ms, self.mesh)

    # -- result ------------------------------------------------------------------------------------
    def _final_result(self) -> torch.Tensor | None:
        """The last stage's (cfg 0, sp 0) rank sends the final latent to global rank 0."""
        mesh = self.mesh
        if mesh.rank("cfg") != 0 or mesh.rank("sp") != 0:
            return None
        if self.last:
            assert self.final_latent is not None
            send_start(self.final_latent, 0, self.group, mesh.stats, "pp_final", self.tags["final"]).wait(self.timeout)
            return None
        if not self.first:
            return None
        buf = torch.empty(tuple(self.latent.shape), dtype=torch.float32, device=self.device)
        x = recv_start(buf, self.pp - 1, self.group, "pp_final", self.tags["final"]).wait(self.timeout)
        x = self.ms.inverse_noise_scaling(final_sigma(self.settings.sampler, self.sigmas), x)
        return unstacked(self.fmt.to_raw(x), self.full_size).cpu()
