"""The sampling tests' oracle: ComfyUI's stored numbers and the analytic "network" they were made with.

tests/data/make_comfy_sampling_reference.py runs ComfyUI's own code on the same network (an identical
copy of ``pattern`` / ``analytic_network`` / ``img2img_latent`` / ``uncond_pattern`` is kept there) and
stores what it returned in tests/data/comfy_sampling_reference.json.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch

from parallel_runtime.sampling import (
    SAMPLERS,
    Guided,
    ModelSampling,
    cfg_combine,
    cfg_needs_uncond,
    discrete_eps,
    flow_flux,
    flow_sd3,
)

torch.set_num_threads(1)

REFERENCE = Path(__file__).parent / "data" / "comfy_sampling_reference.json"
HAS_TORCHSDE = importlib.util.find_spec("torchsde") is not None
CONSTRUCTORS = {"discrete_eps": discrete_eps, "flow_sd3": flow_sd3, "flow_flux": flow_flux}


def _load() -> dict:
    return json.loads(REFERENCE.read_text())


REF = _load()


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def build(model: str) -> ModelSampling:
    spec = REF["models"][model]
    return CONSTRUCTORS[spec["kind"]](**spec["args"])


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float = 1e-6, atol: float = 1e-7) -> None:
    torch.testing.assert_close(actual.float(), expected, rtol=rtol, atol=atol)


# ---- the analytic "network" (identical copy in tests/data/make_comfy_sampling_reference.py) ---------


def pattern(shape) -> torch.Tensor:
    n = math.prod(shape)
    return torch.linspace(-1.0, 1.0, n, dtype=torch.float32).reshape(shape)


def analytic_network(xc: torch.Tensor, t: torch.Tensor, pat: torch.Tensor, omega: float) -> torch.Tensor:
    """A smooth, nonlinear stand-in for a DiT: eps / velocity from the scaled input and the timestep."""
    t = t.float()
    if t.ndim:
        t = t.reshape(-1, *([1] * (xc.ndim - 1)))
    return torch.tanh(0.7 * xc + 0.2 * pat) * (0.6 + 0.3 * torch.sin(t * omega + 0.5)) + 0.05 * pat


def img2img_latent(shape) -> torch.Tensor:
    return torch.cos(pattern(shape) * 7.0) * 0.8


def uncond_pattern(shape) -> torch.Tensor:
    """The negative branch's pattern (its network differs from the positive's only here)."""
    return 0.1 - 0.6 * pattern(shape)


def denoiser(ms: ModelSampling, pat: torch.Tensor, omega: float):
    """BaseModel._apply_model around the analytic network: input scaling, timestep, denoised."""

    def denoise_fn(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        out = analytic_network(ms.calculate_input(sigma, x), ms.timestep(sigma).float(), pat, omega)
        return ms.calculate_denoised(sigma, out, x)

    return denoise_fn


def guided_denoiser(ms: ModelSampling, case: dict, rows: slice = slice(None)):
    """Classifier-free guidance of the two analytic branches as the engine's Denoiser does it: the
    negative evaluated when cfg != 1 or the sampler is CFG++ (which also gets the unconditional
    prediction, 0 without a negative); ``rows``: the patch of the latent this denoiser sees."""
    shape, cfg = case["shape"], case.get("cfg", 1.0)
    cond = denoiser(ms, pattern(shape)[..., rows, :], case["omega"])
    uncond = denoiser(ms, uncond_pattern(shape)[..., rows, :], case["omega"])
    cfg_pp = SAMPLERS[case["sampler"]].cfg_pp
    use_uncond = case.get("negative", True) and (cfg_needs_uncond(cfg) or cfg_pp)

    def denoise_fn(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor | Guided:
        u = uncond(x, sigma) if use_uncond else None
        d = cfg_combine(cond(x, sigma), u, cfg)
        return Guided(d, torch.zeros_like(x) if u is None else u) if cfg_pp else d

    return denoise_fn
