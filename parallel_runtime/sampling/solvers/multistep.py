"""Linear multistep methods in sigma (docs/sampling.md §4.2): lms, ipndm, ipndm_v and deis.

All four step ``x_{i+1} = x_i + sum_j c_{i,j} d_{i-j}`` over the ODE slopes of the last steps and differ
only in the weights ``c``, so one runner takes a weight rule ``(i, order) -> [c_i0, c_i1, ...]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy
import torch
from numpy.polynomial import polynomial

from ..protocol import Run, SamplerGen, ask
from ..trajectory import derivative

Weights = Callable[[int, int], Sequence[float | torch.Tensor]]


def _run_multistep(
    x: torch.Tensor, sigmas: torch.Tensor, max_order: int, weights: Weights, land_on_prediction: bool
) -> SamplerGen:
    """The shared loop; ``land_on_prediction``: the step onto sigma 0 returns D (else it is the Euler step)."""
    slopes: list[torch.Tensor] = []  # newest first
    for i, (sigma, target) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        denoised = yield from ask(x, sigma, i)
        slopes = [derivative(x, sigma, denoised), *slopes][:max_order]
        if target <= 0 and land_on_prediction:
            x = denoised
            continue
        order = 1 if target <= 0 else len(slopes)
        step = torch.zeros_like(x)
        for c, slope in zip(weights(i, order), slopes):
            step = step + c * slope
        x = x + step
    return x


# -- lms: exact integrals of the Lagrange interpolant of the slopes over [sigma_i, sigma_{i+1}] ------------
def _lagrange_integrals(nodes: Sequence[float], start: float, stop: float) -> list[float]:
    """``int_start^stop l_j(s) ds`` for the Lagrange basis of ``nodes`` (l_j is 1 at nodes[j])."""
    out = []
    for j, node in enumerate(nodes):
        others = [n for k, n in enumerate(nodes) if k != j]
        basis = polynomial.polyfromroots(others) / math.prod(node - n for n in others)
        antiderivative = polynomial.polyint(basis)
        out.append(float(polynomial.polyval(stop, antiderivative) - polynomial.polyval(start, antiderivative)))
    return out


def lms(x: torch.Tensor, sigmas: torch.Tensor, run: Run, max_order: int = 4) -> SamplerGen:
    """Linear multistep with the exact Adams-Bashforth weights for the actual (uneven) sigma steps."""
    nodes = numpy.asarray(sigmas.detach().cpu().float(), dtype=numpy.float64)

    def weights(i: int, order: int) -> list[float]:
        return _lagrange_integrals([nodes[i - j] for j in range(order)], nodes[i], nodes[i + 1])

    return (yield from _run_multistep(x, sigmas, max_order, weights, land_on_prediction=True))


# -- ipndm: the classical (equal-step) Adams-Bashforth weights --------------------------------------------
ADAMS_BASHFORTH = ((1.0,), (3 / 2, -1 / 2), (23 / 12, -16 / 12, 5 / 12), (55 / 24, -59 / 24, 37 / 24, -9 / 24))


def ipndm(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """Improved PNDM: Adams-Bashforth of order up to 4 with the equal-step weights."""
    steps = sigmas.diff()

    def weights(i: int, order: int) -> list[torch.Tensor]:
        return [steps[i] * a for a in ADAMS_BASHFORTH[order - 1]]

    return (yield from _run_multistep(x, sigmas, 4, weights, land_on_prediction=True))


# -- ipndm_v: the variable-step iPNDM weights of Zhou et al. (2024) ----------------------------------------
def _ipndm_v_weights(h: torch.Tensor, past: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Weights (times the step h) for step h after the earlier steps ``past`` = (a, b, c) newest first."""
    if not past:
        return [h]
    a = past[0]
    lead = h / (2 * a)
    if len(past) == 1:
        return [h * (1 + lead), h * -lead]
    b = past[1]
    t1 = (1 - h**2 / (3 * a * (a + b))) / 2
    if len(past) == 2:
        return [h * (1 + lead + t1), h * (-lead - (1 + a / b) * t1), h * (t1 * a / b)]
    c = past[2]
    q = a * (a + b) / (b * (b + c))
    shape = (1 - h / (3 * (h + a))) / 2 + (1 - h / (2 * (h + a))) * h / (6 * (h + a + b))
    t2 = shape * h * (h + a) * (h + a + b) / (a * (a + b) * (a + b + c))
    return [
        h * (1 + lead + t1 + t2),
        h * (-lead - (1 + a / b) * t1 - (1 + a / b + q) * t2),
        h * (t1 * a / b + (a / b + q * (1 + b / c)) * t2),
        h * (-t2 * q * a / b),
    ]


def ipndm_v(x: torch.Tensor, sigmas: torch.Tensor, run: Run) -> SamplerGen:
    """iPNDM with the variable-step weights (equal to Adams-Bashforth for equal steps)."""
    steps = sigmas.diff()

    def weights(i: int, order: int) -> list[torch.Tensor]:
        return _ipndm_v_weights(steps[i], [steps[i - k] for k in range(1, order)])

    return (yield from _run_multistep(x, sigmas, 4, weights, land_on_prediction=True))


# -- deis: Lagrange weights in the VP time tau, integrated over sigma ---------------------------------------
DEIS_EDM_SIGMA_MIN, DEIS_EDM_SIGMA_MAX, DEIS_EPS_S = 0.002, 80.0, 1e-3
DEIS_QUADRATURE_NODES = 10_000


def _vp_linear_beta() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(beta_0, beta_1, beta_1 - beta_0 as computed) of the linear-beta VP process that maps EDM's
    sigma range [0.002, 80] onto tau in [1e-3, 1], in float32."""
    low = torch.log(torch.tensor(DEIS_EDM_SIGMA_MIN) ** 2 + 1)
    high = torch.log(torch.tensor(DEIS_EDM_SIGMA_MAX) ** 2 + 1)
    spread = 2 * (low / DEIS_EPS_S - high) / (DEIS_EPS_S - 1)
    beta_0 = high - 0.5 * spread
    return beta_0, spread + beta_0, spread


def _vp_time(sigmas: torch.Tensor, beta_0: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """tau(sigma): the VP time whose alpha-bar = exp(-tau^2 spread / 2 - tau beta_0) is 1 / (1 + sigma^2)."""
    return ((beta_0**2 + 2 * spread * (sigmas**2 + 1).log()).sqrt() - beta_0) / spread


def _deis_weights(tau: torch.Tensor, beta_0: torch.Tensor, beta_1: torch.Tensor, i: int, order: int) -> list:
    """``int g(t) l_j(t) dt`` over [tau_i, tau_{i+1}] by ComfyUI's Riemann rule, g = d sigma / d tau."""
    start, stop = tau[i], tau[i + 1]
    t = torch.linspace(start, stop, DEIS_QUADRATURE_NODES)
    rate = beta_0 + t * (beta_1 - beta_0)
    alpha_bar = torch.exp(-0.5 * t**2 * (beta_1 - beta_0) - t * beta_0)
    g = 0.5 * rate / torch.sqrt(alpha_bar * (1 - alpha_bar))
    nodes = [tau[i - j] for j in range(order)]
    out = []
    for j, node in enumerate(nodes):
        basis = torch.ones_like(t)
        for k, other in enumerate(nodes):
            if k != j:
                basis = basis * (t - other) / (node - other)
        out.append(torch.sum(g * basis) * ((stop - start) / DEIS_QUADRATURE_NODES))
    return out


def deis(x: torch.Tensor, sigmas: torch.Tensor, run: Run, max_order: int = 3) -> SamplerGen:
    """DEIS (tAB): Adams-Bashforth weights for nodes in the VP time tau (Zhang & Chen 2022)."""
    beta_0, beta_1, spread = _vp_linear_beta()
    tau = _vp_time(sigmas.detach().cpu().float(), beta_0, spread)
    steps = sigmas.diff()

    def weights(i: int, order: int) -> list:
        return [steps[i]] if order == 1 else _deis_weights(tau, beta_0, beta_1, i, order)

    return (yield from _run_multistep(x, sigmas, max_order, weights, land_on_prediction=False))
