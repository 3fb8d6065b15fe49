"""UniPC (Zhao et al. 2023): the unified multistep predictor-corrector with B(h) = h (bh1, ``uni_pc``) or
B(h) = e^h - 1 (bh2, ``uni_pc_bh2``), data prediction, run on the VP process of each sigma as ComfyUI
runs it (docs/sampling.md §4.9)."""

from __future__ import annotations

from collections.abc import Generator

import torch

from ..protocol import Answer, ModelCall, Run, SamplerGen, ask

UNIPC_LAST_SIGMA = 0.001
"""A schedule's final sigma 0 becomes this (the result stays at it; flow models divide by 1 - it)."""


def vp_marginals(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log alpha, sigma_vp, lambda) of the VP process with alpha-bar = 1 / (1 + sigma^2), in float32
    through alpha-bar as ComfyUI evaluates them (so lambda is not exactly -log sigma at small sigma)."""
    log_alpha = 0.5 * torch.log(1 / (sigma * sigma + 1))
    noise_var = 1.0 - torch.exp(2.0 * log_alpha)
    return log_alpha, torch.sqrt(noise_var), log_alpha - 0.5 * torch.log(noise_var)


def _to_ve(x_vp: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """The latent the model sees (k-diffusion's scale) for a VP-state ``x_vp`` at ``sigma``."""
    return x_vp * ((sigma**2 + 1.0) ** 0.5)


def unipc_schedule(sigmas: torch.Tensor) -> torch.Tensor:
    """The sigmas UniPC walks: a final 0 replaced by :data:`UNIPC_LAST_SIGMA`."""
    if sigmas[-1] != 0:
        return sigmas
    out = sigmas.clone()
    out[-1] = UNIPC_LAST_SIGMA
    return out


def _coefficients(ratios: torch.Tensor, hh: torch.Tensor, order: int, bh2: bool) -> tuple:
    """(R, b, B, e^hh - 1): the order conditions ``R rho = b`` of UniP/UniC for the step ``hh = -h``."""
    grow = torch.expm1(hh)
    scale = grow if bh2 else hh
    phi = grow / hh - 1  # h phi_2 normalised; then h phi_(k+1) recursively
    rows, rhs, factorial = [], [], 1
    for k in range(1, order + 1):
        rows.append(torch.pow(ratios, k - 1))
        rhs.append(phi * factorial / scale)
        factorial *= k + 1
        phi = phi / hh - 1 / factorial
    return torch.stack(rows), torch.stack(rhs), scale, grow


def _update(
    x: torch.Tensor,
    history: list[tuple[torch.Tensor, torch.Tensor]],
    t: torch.Tensor,
    order: int,
    correct: bool,
    bh2: bool,
    step: int,
) -> Generator[ModelCall, Answer, tuple[torch.Tensor, torch.Tensor | None]]:
    """One UniPC step from the newest history point to ``t``; returns (x, D at the predicted point or None)."""
    (s, newest), earlier = history[-1], history[-order:-1][::-1]
    _, sigma_vp_s, lam_s = vp_marginals(s)
    log_alpha_t, sigma_vp_t, lam_t = vp_marginals(t)
    alpha_t = torch.exp(log_alpha_t)
    h = lam_t - lam_s
    ratios = [(vp_marginals(s_m)[2] - lam_s) / h for s_m, _ in earlier]
    slopes = [(d_m - newest) / r for (_, d_m), r in zip(earlier, ratios)]
    R, b, scale, grow = _coefficients(torch.stack([*ratios, torch.ones_like(h)]), -h, order, bh2)
    base = (sigma_vp_t / sigma_vp_s) * x - (alpha_t * grow) * newest
    x_t = base
    if slopes:
        rho = torch.tensor([0.5]) if order == 2 else torch.linalg.solve(R[:-1, :-1], b[:-1])
        x_t = base - (alpha_t * scale) * sum((c * d for c, d in zip(rho, slopes)), torch.zeros_like(x))
    if not correct:
        return x_t, None
    rho_c = torch.tensor([0.5]) if order == 1 else torch.linalg.solve(R, b)
    at_t = yield from ask(_to_ve(x_t, t), t, step)
    correction = sum((c * d for c, d in zip(rho_c[:-1], slopes)), torch.zeros_like(x))
    x_t = base - (alpha_t * scale) * (correction + rho_c[-1] * (at_t - newest))
    return x_t, at_t


def unipc(x: torch.Tensor, sigmas: torch.Tensor, run: Run, *, bh2: bool = False) -> SamplerGen:
    """UniPC multistep of order min(3, steps - 1), lower orders at the start and the end."""
    times = unipc_schedule(sigmas)
    steps = len(times) - 1
    order = min(3, steps - 1)
    x = x / torch.sqrt(1.0 + times[0] ** 2.0)  # the VP state
    history: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i in range(steps):
        if i == 0:
            history.append((times[0], (yield from ask(_to_ve(x, times[0]), times[0], 0))))
            continue
        if i < order:
            x, at_t = yield from _update(x, history, times[i], i, True, bh2, i)
            history.append((times[i], at_t))
            continue
        for j in (i, i + 1) if i == steps - 1 else (i,):
            x, at_t = yield from _update(x, history, times[j], min(order, steps + 1 - j), j != steps, bh2, j)
            if at_t is not None:
                history = [*history, (times[j], at_t)][-order:]
    return x / torch.exp(vp_marginals(times[-1])[0])
