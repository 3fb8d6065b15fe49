"""Noise: the initial latent noise and the noise samplers of ancestral / SDE samplers (ComfyUI semantics).

A noise sampler is a callable ``noise(sigma, sigma_next) -> Tensor`` shaped like the latent, called
once per step by the stochastic samplers (ComfyUI's ``noise_sampler`` signature). ``GeneratorNoise``
and ``BrownianTreeNoise`` always draw for the FULL latent; ``SharedNoise`` hands out slices of one
full draw to the patches of a split latent, so results do not depend on how the latent is split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ..errors import ConfigError

Region = slice | tuple[int, int] | tuple[slice, ...] | None
"""Part of a [B, C, H, W] latent: ``slice`` or ``(start, stop)`` = rows along H; tuple of slices = index."""


class NoiseSampler(Protocol):
    """``noise(sigma, sigma_next)``: unit-variance noise for the step from ``sigma`` to ``sigma_next``."""

    def __call__(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor: ...


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ConfigError(
            f"seed is {seed!r}",
            "noise is drawn from a torch generator seeded with an integer",
            "pass an integer seed in [0, 2**64)",
        )


def initial_noise(
    seed: int, shape: Sequence[int], *, batch_index: Sequence[int] | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The starting noise ComfyUI's ``prepare_noise`` makes for a latent of ``shape`` (on the CPU).

    One CPU draw of the full shape; with ``batch_index`` (a latent's "batch_index", one entry per batch
    item) per-item draws are made for indices 0..max in order and item ``i`` gets draw ``batch_index[i]``.
    """
    _check_seed(seed)
    shape = tuple(int(s) for s in shape)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    if batch_index is None:
        return torch.randn(shape, dtype=dtype, generator=generator, device="cpu")
    indices = [int(i) for i in batch_index]
    if len(indices) != shape[0] or min(indices, default=0) < 0:
        raise ConfigError(
            f"batch_index {indices} for a latent of batch size {shape[0]}",
            "batch_index gives each batch item the index of its noise draw, so it needs one non-negative entry per item",
            "pass one index >= 0 per batch item, or batch_index=None",
        )
    draws = [
        torch.randn((1,) + shape[1:], dtype=dtype, generator=generator, device="cpu") for _ in range(max(indices) + 1)
    ]
    return torch.cat([draws[i] for i in indices], dim=0)


class GeneratorNoise:
    """ComfyUI's ``default_noise_sampler``: a generator seeded once, one full-size draw per call."""

    def __init__(
        self,
        shape: Sequence[int],
        seed: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        _check_seed(seed)
        self.shape, self.dtype, self.device = tuple(int(s) for s in shape), dtype, torch.device(device)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        return torch.randn(self.shape, dtype=self.dtype, device=self.device, generator=self._generator)


class BrownianTreeNoise:
    """ComfyUI's ``BrownianTreeNoiseSampler`` (CPU tree, one seed): Brownian increments over sigma.

    Needs ``torchsde``. ``sigma_min`` / ``sigma_max`` are the smallest positive and the largest sigma
    of the schedule (before any sampler-side adjustment of the first sigma).
    """

    def __init__(
        self,
        shape: Sequence[int],
        sigma_min: torch.Tensor | float,
        sigma_max: torch.Tensor | float,
        seed: int,
        *,
        dtype: torch.dtype = torch.float32,
    ):
        _check_seed(seed)
        try:
            import torchsde
        except ImportError as exc:
            raise ConfigError(
                "the Brownian-tree noise of dpmpp_2m_sde needs the torchsde package, which is not installed",
                "ComfyUI's dpmpp_2m_sde draws its noise from a torchsde.BrownianTree; other noise would change the image",
                "pip install torchsde (or pass another noise sampler explicitly)",
            ) from exc
        t0, t1 = torch.as_tensor(sigma_min), torch.as_tensor(sigma_max)
        t0, t1, self._sign = (t0, t1, 1) if t0 < t1 else (t1, t0, -1)
        w0 = torch.zeros(tuple(int(s) for s in shape), dtype=dtype)
        self._tree = torchsde.BrownianTree(t0.detach().cpu(), w0, t1.detach().cpu(), entropy=seed)

    def _increment(self, t0: torch.Tensor, t1: torch.Tensor) -> torch.Tensor:
        t0, t1, sign = (t0, t1, 1) if t0 < t1 else (t1, t0, -1)
        device, dtype = t0.device, t0.dtype
        w = self._tree(t0.detach().cpu().float(), t1.detach().cpu().float())
        return w.to(device=device, dtype=dtype) * (self._sign * sign)

    def __call__(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        t0, t1 = torch.as_tensor(sigma), torch.as_tensor(sigma_next)
        return self._increment(t0, t1) / (t1 - t0).abs().sqrt()


def _region_index(region: Region, shape: tuple[int, ...]) -> tuple[slice, ...]:
    if region is None:
        return ()
    if isinstance(region, slice):
        region = (region.start, region.stop) if region.step in (None, 1) else region
    if isinstance(region, tuple) and len(region) == 2 and all(isinstance(v, int) or v is None for v in region):
        if len(shape) < 2:
            raise ConfigError(
                f"row band {region} of a latent shaped {list(shape)}",
                "a row band selects rows along H, the second-to-last dimension",
                "give a [B, C, H, W] latent shape, or a tuple of slices",
            )
        start, stop = region
        height = shape[-2]
        start, stop = 0 if start is None else start, height if stop is None else stop
        if not 0 <= start < stop <= height:
            raise ConfigError(
                f"row band {start}:{stop} of a latent with H={height}",
                "a patch must be a non-empty band of rows inside the latent",
                f"use 0 <= start < stop <= {height}",
            )
        return (slice(None),) * (len(shape) - 2) + (slice(start, stop),)
    if isinstance(region, tuple) and all(isinstance(s, slice) for s in region) and len(region) <= len(shape):
        return region
    raise ConfigError(
        f"noise region {region!r}",
        "a region is a row band along H or an index made of slices",
        "pass slice(start, stop) or (start, stop) for rows, a tuple of slices, or None for the whole latent",
    )


class NoiseView:
    """The slice of a :class:`SharedNoise` that one patch uses; a noise sampler for that patch."""

    def __init__(self, shared: SharedNoise, index: tuple[slice, ...]):
        self._shared, self.index, self.calls = shared, index, 0

    def __call__(self, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        full = self._shared._draw(self, sigma, sigma_next)
        return full[self.index]


class SharedNoise:
    """Draws noise for the WHOLE latent and hands out slices, so patches share each draw.

    Every :meth:`view` counts its own calls; call ``n`` of any view gets its slice of the full latent's
    ``n``-th draw, made by the first view to ask for it and kept until every view has used it. A patch
    may therefore run ahead of the others. Create all views before sampling starts.
    """

    def __init__(self, sampler: NoiseSampler, shape: Sequence[int]):
        self._sampler, self.shape = sampler, tuple(int(s) for s in shape)
        self._views: list[NoiseView] = []
        self._draws: dict[int, tuple[tuple[float, float], torch.Tensor]] = {}
        self._drawn = 0

    def view(self, region: Region = None) -> NoiseView:
        """Noise sampler for ``region`` of the latent (None: the whole latent)."""
        if self._drawn:
            raise ConfigError(
                "SharedNoise.view() called after noise was drawn",
                "a late view would start at draw 0, which may already be discarded",
                "create the views of all patches before running any sampler",
            )
        view = NoiseView(self, _region_index(region, self.shape))
        self._views.append(view)
        return view

    def _draw(self, view: NoiseView, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
        n, key = view.calls, (float(sigma), float(sigma_next))
        if n == self._drawn:
            draw = self._sampler(sigma, sigma_next)
            if tuple(draw.shape) != self.shape:
                raise ConfigError(
                    f"the shared noise sampler drew shape {list(draw.shape)}, expected {list(self.shape)}",
                    "SharedNoise slices patches out of draws for the whole latent",
                    "build the wrapped noise sampler with the full latent's shape",
                )
            self._draws[n] = (key, draw)
            self._drawn += 1
        cached_key, full = self._draws[n]
        if cached_key != key:
            raise ConfigError(
                f"noise draw {n} was requested for sigmas {key} but made for {cached_key}",
                "all patches must run the same sampler over the same sigmas to share noise draws",
                "give every patch the same sampler, sigmas and options",
            )
        view.calls += 1
        oldest_needed = min(v.calls for v in self._views)
        for old in [i for i in self._draws if i < oldest_needed]:
            del self._draws[old]
        return full
