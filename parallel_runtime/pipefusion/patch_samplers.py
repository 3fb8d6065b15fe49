"""The last PipeFusion stage's samplers: one sampler generator per patch (noise from one shared
draw, so every sampler works patch by patch), fed each item's denoised prediction; with a LATENT's noise
mask, ComfyUI's inpainting rule applied to each band (:class:`BandInpainting`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..denoise.loop import inpaint_noise, start_noise
from ..denoise.settings import SamplingSettings
from ..sampling import Guided, ModelCall, ModelSampling, SharedNoise, default_noise, noise_latent, sampler_steps
from .schedule import Band, Item, PipelineSchedule


class BandInpainting:
    """The single-device ``denoise.loop.Inpainting`` rule on a band of rows (all tensors in the stacked
    view [B, C, rows, W]): the model sees ``x`` where the mask is 1 and the input latent (re-noised to the
    round's sigma, or clean) where it is 0, and the prediction there is the input latent."""

    def __init__(
        self,
        mask: torch.Tensor,
        latent: torch.Tensor,
        noise: torch.Tensor,
        model_sampling: ModelSampling,
        clean: bool,
    ):
        self.mask, self.latent, self.noise, self.ms, self.clean = mask, latent, noise, model_sampling, clean

    def model_input(self, x: torch.Tensor, rows: tuple[int, int], sigma: float) -> torch.Tensor:
        mask, latent = self.mask[..., rows[0] : rows[1], :], self.latent[..., rows[0] : rows[1], :]
        if self.clean:
            fill = latent
        else:
            s = torch.tensor(sigma, dtype=torch.float32, device=x.device)
            fill = self.ms.noise_scaling(s, self.noise[..., rows[0] : rows[1], :], latent)
        return x * mask + fill * (1.0 - mask)

    def prediction(self, answer: torch.Tensor | Guided, rows: tuple[int, int]) -> torch.Tensor | Guided:
        mask, latent = self.mask[..., rows[0] : rows[1], :], self.latent[..., rows[0] : rows[1], :]
        if isinstance(answer, Guided):  # a CFG++ sampler's unconditional prediction stays the model's
            return Guided(answer.denoised * mask + latent * (1.0 - mask), answer.uncond)
        return answer * mask + latent * (1.0 - mask)


class PatchSamplers:
    """Per-patch sampler generators on the last stage, and the latents they send back to stage 0.

    ``latent`` is the whole start latent in model space (not yet noised); ``send_latent(x)`` sends
    an item's next latent to stage 0. ``mask`` (stacked like ``latent``, 1 = denoise): the LATENT's noise
    mask, applied as ComfyUI's inpainting (``clean_fill``: the kept region stays the clean latent, as
    ComfyUI's WAN22 keeps it)."""

    def __init__(
        self,
        sched: PipelineSchedule,
        settings: SamplingSettings,
        model_sampling: ModelSampling,
        sigmas: torch.Tensor,
        latent: torch.Tensor,
        patch_size: int,
        device: torch.device,
        send_latent: Callable[[torch.Tensor], None],
        mask: torch.Tensor | None = None,
        clean_fill: bool = False,
    ):
        self.sched, self.send_latent = sched, send_latent
        ms = model_sampling
        noise = start_noise(settings, latent.shape) if settings.add_noise else torch.zeros(latent.shape)
        x = noise_latent(ms, sigmas, noise, latent).to(device)
        self.inpaint: BandInpainting | None = None
        if mask is not None:
            fill = inpaint_noise(settings, noise).to(device)
            self.inpaint = BandInpainting(mask.to(device), latent.to(device), fill, ms, clean_fill)
        full = default_noise(settings.sampler, tuple(x.shape), sigmas, settings.seed)
        shared = None if full is None else SharedNoise(full, tuple(x.shape))
        p = patch_size
        self.rows = [band.latent_rows(p) for band in sched.bands]
        views = [None if shared is None else shared.view(r) for r in self.rows]
        options = {"model_sampling": ms, "eta": settings.eta, "s_noise": settings.s_noise}
        self.gens = [
            sampler_steps(settings.sampler, x[..., r0:r1, :], sigmas, v, **options)
            for (r0, r1), v in zip(self.rows, views)
        ]
        self.calls: list[ModelCall | None] = [next(g) for g in self.gens]
        self.finals: list[torch.Tensor | None] = [None] * len(self.gens)
        self.preview = torch.zeros_like(x)
        self.done: set[int] = set()
        self.sent: set[int] = set()
        self.dependents = sched.dependents()
        self.last_of_step = sched.last_item_of_step()

    def _patches_of(self, band: Band) -> list[int]:
        return list(range(len(self.gens))) if band.index is None else [band.index]

    def x_of(self, item: Item) -> torch.Tensor:
        rnd = self.sched.rounds[item.round]
        xs = []
        for p in self._patches_of(item.band):
            call = self.calls[p]
            if call is None or (call.step, call.stage) != (rnd.step, rnd.stage):
                raise RuntimeError(f"patch {p} sampler is at {call} but item {item.index} is round {rnd}")
            xs.append(call.x)
        x = xs[0] if len(xs) == 1 else torch.cat(xs, dim=-2)
        if self.inpaint is not None:  # what the model sees of this band (sent to stage 0, used for the prediction)
            x = self.inpaint.model_input(x, self._rows_of(item.band), rnd.sigma)
        return x

    def _rows_of(self, band: Band) -> tuple[int, int]:
        patches = self._patches_of(band)
        return self.rows[patches[0]][0], self.rows[patches[-1]][1]

    def step(self, item: Item, answer: torch.Tensor | Guided) -> None:
        """Feed the item's prediction (Guided for CFG++) to its patches' samplers; send ready latents to stage 0."""
        rnd = self.sched.rounds[item.round]
        start = self.rows[self._patches_of(item.band)[0]][0]
        if self.inpaint is not None:
            answer = self.inpaint.prediction(answer, self._rows_of(item.band))
        for p in self._patches_of(item.band):
            r0, r1 = self.rows[p]
            rows = (..., slice(r0 - start, r1 - start), slice(None))
            if isinstance(answer, Guided):
                part = Guided(answer.denoised[rows], answer.uncond[rows])
            else:
                part = answer[rows]
            if rnd.stage == 0:
                self.preview[..., r0:r1, :] = part.denoised if isinstance(part, Guided) else part
            try:
                self.calls[p] = self.gens[p].send(part)
            except StopIteration as stop:
                self.calls[p], self.finals[p] = None, stop.value
        self.done.add(item.index)
        for n in self.dependents.get(item.index, []):
            self._send_if_ready(self.sched.items[n])

    def send_initial(self) -> None:
        for item in self.sched.items:
            if item.round == 0:
                self._send_if_ready(item)

    def _send_if_ready(self, item: Item) -> None:
        if item.index in self.sent or not all(d in self.done for d in item.deps):
            return
        self.sent.add(item.index)
        self.send_latent(self.x_of(item).contiguous())

    def final(self) -> torch.Tensor:
        if any(f is None for f in self.finals):
            raise RuntimeError("PipeFusion ended before every patch's sampler finished")
        return torch.cat(self.finals, dim=-2).contiguous()  # type: ignore[arg-type]
