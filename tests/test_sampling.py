"""parallel_runtime.sampling against numbers produced by ComfyUI's own code.

The reference (tests/data/comfy_sampling_reference.json) is made by
tests/data/make_comfy_sampling_reference.py, which runs ComfyUI's schedulers, model sampling objects,
KSampler sigmas, k-diffusion samplers (through KSAMPLER.sample) and noise functions.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.sampling import (
    SAMPLER_NAMES,
    SCHEDULER_NAMES,
    BrownianTreeNoise,
    GeneratorNoise,
    ModelSampling,
    SharedNoise,
    calculate_sigmas,
    cfg_combine,
    cfg_needs_uncond,
    default_noise,
    discrete_eps,
    flow_flux,
    flow_sd3,
    flux_shift,
    initial_noise,
    noise_latent,
    sample,
    sampler_steps,
    sampler_uses_noise,
    sigmas_for_denoise,
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


# ---- the analytic "network" (identical copy in tests/data/make_comfy_sampling_reference.py) ---------------


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


def denoiser(ms: ModelSampling, pat: torch.Tensor, omega: float):
    """BaseModel._apply_model around the analytic network: input scaling, timestep, denoised."""

    def denoise_fn(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        out = analytic_network(ms.calculate_input(sigma, x), ms.timestep(sigma).float(), pat, omega)
        return ms.calculate_denoised(sigma, out, x)

    return denoise_fn


# ---- model sampling -------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(REF["model_sampling"]))
def test_model_sampling_matches_comfy(model: str) -> None:
    ref, ms = REF["model_sampling"][model], build(model)
    assert len(ms.sigmas) == ref["num_sigmas"]
    assert ms.sigmas.dtype == torch.float32
    close(ms.sigma_min, torch.tensor(ref["sigma_min"]))
    close(ms.sigma_max, torch.tensor(ref["sigma_max"]))
    close(ms.sigmas[ref["table_index"]], torch.tensor(ref["table"]))
    close(ms.timestep(tensor(ref["timestep_in"])).float(), tensor(ref["timestep_out"]))
    close(torch.stack([ms.sigma(t) for t in tensor(ref["sigma_in"])]), tensor(ref["sigma_out"]))
    got = [ms.percent_to_sigma(p) for p in ref["percent_in"]]
    close(torch.tensor(got, dtype=torch.float64).float(), torch.tensor(ref["percent_out"]))
    x, out, latent = tensor(ref["x"]), tensor(ref["model_output"]), tensor(ref["latent"])
    for tag, sigma in (("one", torch.tensor(ref["sigma_one"])), ("batch", tensor(ref["sigma_batch"]))):
        close(ms.calculate_input(sigma, x), tensor(ref[f"calculate_input_{tag}"]))
        close(ms.calculate_denoised(sigma, out, x), tensor(ref[f"calculate_denoised_{tag}"]))
        close(ms.noise_scaling(sigma, x, latent), tensor(ref[f"noise_scaling_{tag}"]))
        close(ms.noise_scaling(sigma, x, latent, max_denoise=True), tensor(ref[f"noise_scaling_max_{tag}"]))
        close(ms.inverse_noise_scaling(sigma, x), tensor(ref[f"inverse_noise_scaling_{tag}"]))
    if "shift" in ref:
        assert ms.shift == pytest.approx(ref["shift"], rel=1e-12)


@pytest.mark.parametrize("model", [m for m in REF["models"] if REF["models"][m]["args"].get("width")])
def test_flux_shift_from_resolution(model: str) -> None:
    args = REF["models"][model]["args"]
    assert flux_shift(**args) == pytest.approx(REF["model_sampling"][model]["shift"], rel=1e-12)


def test_model_kinds() -> None:
    assert not discrete_eps().is_flow
    assert flow_sd3().is_flow and flow_flux(1024, 1024).is_flow
    assert flow_sd3().timestep(torch.tensor(0.5)) == pytest.approx(500.0)
    assert flow_flux(512, 512).timestep(torch.tensor(0.5)) == pytest.approx(0.5)


# ---- schedulers -----------------------------------------------------------------------------------------


def _scheduler_groups() -> list[tuple[str, str]]:
    return sorted({(e["model"], e["scheduler"]) for e in REF["schedulers"]})


def test_reference_covers_every_scheduler() -> None:
    assert {s for _, s in _scheduler_groups()} == set(SCHEDULER_NAMES)
    assert set(SCHEDULER_NAMES) == {"simple", "normal", "karras", "exponential", "sgm_uniform", "beta", "ddim_uniform"}


@pytest.mark.parametrize(("model", "scheduler"), _scheduler_groups())
def test_scheduler_matches_comfy(model: str, scheduler: str) -> None:
    ms = build(model)
    for entry in (e for e in REF["schedulers"] if e["model"] == model and e["scheduler"] == scheduler):
        sigmas = calculate_sigmas(ms, scheduler, entry["steps"])
        assert sigmas.dtype == torch.float32
        close(sigmas, tensor(entry["sigmas"]))


@pytest.mark.parametrize(
    "case",
    REF["ksampler_sigmas"],
    ids=lambda c: f"{c['model']}-{c['scheduler']}-{c['steps']}-{c['denoise']}-{c['sampler']}",
)
def test_sigmas_for_denoise_matches_ksampler(case: dict) -> None:
    ms = build(case["model"])
    sigmas = sigmas_for_denoise(ms, case["scheduler"], case["steps"], case["denoise"], sampler=case["sampler"])
    close(sigmas, tensor(case["sigmas"]))


# ---- samplers -------------------------------------------------------------------------------------------


def _case_id(case: dict) -> str:
    extras = "-".join(f"{k}={case[k]}" for k in ("denoise", "eta", "s_noise", "noise") if k in case and case[k] != 1.0)
    return f"{case['model']}-{case['sampler']}-{case['scheduler']}-{case['shape'][0]}{'-' + extras if extras else ''}"


def test_reference_covers_every_sampler() -> None:
    assert {c["sampler"] for c in REF["samplers"]} == set(SAMPLER_NAMES)
    assert {"euler", "euler_ancestral", "heun", "dpm_2", "dpmpp_2m", "dpmpp_2m_sde", "ddim", "lcm"} == set(
        SAMPLER_NAMES
    )


def _run_case(case: dict, callback=None) -> torch.Tensor:
    ms, shape, seed = build(case["model"]), case["shape"], case["seed"]
    sigmas = sigmas_for_denoise(ms, case["scheduler"], case["steps"], case["denoise"], sampler=case["sampler"])
    close(sigmas, tensor(case["sigmas"]))
    latent = img2img_latent(shape) if case.get("img2img") else torch.zeros(shape)
    x = noise_latent(ms, sigmas, initial_noise(seed, shape), latent)
    if case.get("noise") == "generator":
        noise = GeneratorNoise(shape, seed)
    else:
        noise = default_noise(case["sampler"], tuple(shape), sigmas, seed)
    fn = denoiser(ms, pattern(shape), case["omega"])
    options = {k: case[k] for k in ("eta", "s_noise") if k in case}
    out = sample(case["sampler"], fn, x, sigmas, noise, model_sampling=ms, callback=callback, **options)
    return ms.inverse_noise_scaling(sigmas[-1], out)


def _needs_torchsde(case: dict) -> bool:
    return case["sampler"] == "dpmpp_2m_sde" and case.get("noise") != "generator"


@pytest.mark.parametrize("case", REF["samplers"], ids=_case_id)
def test_sampler_matches_comfy(case: dict) -> None:
    if _needs_torchsde(case) and not HAS_TORCHSDE:
        pytest.skip("ComfyUI's default dpmpp_2m_sde noise is a torchsde Brownian tree; torchsde is not installed")
    seen: list[dict] = []

    def callback(i: int, x: torch.Tensor, denoised: torch.Tensor) -> None:
        seen.append({"i": i, "x_mean": x.double().mean().item(), "denoised_mean": denoised.double().mean().item()})

    out = _run_case(case, callback)
    close(out, tensor(case["output"]), rtol=1e-5, atol=1e-5)
    assert [s["i"] for s in seen] == [s["i"] for s in case["callback"]]
    for ours, theirs in zip(seen, case["callback"]):
        assert ours["x_mean"] == pytest.approx(theirs["x_mean"], rel=1e-5, abs=1e-5)
        assert ours["denoised_mean"] == pytest.approx(theirs["denoised_mean"], rel=1e-5, abs=1e-5)


def test_sampler_generator_protocol() -> None:
    """heun / dpm_2 ask twice per step (not on the last step to sigma 0); the return value is the latent."""
    ms = discrete_eps()
    sigmas = calculate_sigmas(ms, "karras", 4)
    x = torch.randn(1, 2, 3, 3, generator=torch.Generator().manual_seed(0)) * sigmas[0]
    for name, expected in (
        ("euler", [(i, 0) for i in range(4)]),
        ("heun", [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]),
    ):
        gen = sampler_steps(name, x, sigmas, model_sampling=ms)
        calls, call = [], next(gen)
        with pytest.raises(StopIteration) as done:
            while True:
                calls.append((call.step, call.stage))
                assert call.x.shape == x.shape and call.sigma.ndim == 0
                call = gen.send(call.x * 0.5)
        assert calls == expected
        assert done.value.value.shape == x.shape
    assert [n for n in SAMPLER_NAMES if sampler_uses_noise(n)] == ["euler_ancestral", "dpmpp_2m_sde", "lcm"]
    assert default_noise("heun", x.shape, sigmas, 0) is None
    assert isinstance(default_noise("euler_ancestral", x.shape, sigmas, 0), GeneratorNoise)
    gen = sampler_steps("euler", x, sigmas, model_sampling=ms)
    next(gen)
    with pytest.raises(ConfigError, match="send"):
        next(gen)


# ---- noise ----------------------------------------------------------------------------------------------


def test_initial_noise_matches_prepare_noise() -> None:
    ref = REF["noise"]["prepare_noise"]
    assert torch.equal(initial_noise(ref["seed"], ref["shape"]), tensor(ref["noise"]))
    ref = REF["noise"]["prepare_noise_batch_index"]
    got = initial_noise(ref["seed"], ref["shape"], batch_index=ref["batch_index"])
    assert torch.equal(got, tensor(ref["noise"]))


def test_generator_noise_matches_default_noise_sampler() -> None:
    ref = REF["noise"]["default_noise_sampler"]
    noise = GeneratorNoise(ref["shape"], ref["seed"])
    for draw in ref["draws"]:
        assert torch.equal(noise(torch.tensor(1.0), torch.tensor(0.5)), tensor(draw))


@pytest.mark.skipif(not HAS_TORCHSDE, reason="torchsde is not installed")
def test_brownian_tree_noise_matches_comfy() -> None:
    ref = REF["noise"]["brownian_tree"]
    noise = BrownianTreeNoise(ref["shape"], torch.tensor(ref["sigma_min"]), torch.tensor(ref["sigma_max"]), ref["seed"])
    for (a, b), draw in zip(ref["pairs"], ref["draws"]):
        close(noise(torch.tensor(a), torch.tensor(b)), tensor(draw))


def _split_run(name: str, model: str, bands: list[tuple[int, int]], order: str, noise_kind: str) -> torch.Tensor:
    """Run ``name`` on row-band patches, each with its own generator and a view of shared full-latent noise."""
    shape, seed = (1, 3, 6, 6), 7
    ms = build(model)
    sigmas = calculate_sigmas(ms, "karras" if model == "pixart" else "simple", 5)
    x = noise_latent(ms, sigmas, initial_noise(seed, shape), torch.zeros(shape))
    if noise_kind == "generator":
        full_noise = GeneratorNoise(shape, seed)
    else:
        full_noise = default_noise(name, shape, sigmas, seed)
    shared = SharedNoise(full_noise, shape)
    pat, omega = pattern(shape), 0.003
    patches = []
    for start, stop in bands:
        view = shared.view((start, stop)) if sampler_uses_noise(name) else None
        fn = denoiser(ms, pat[..., start:stop, :], omega)
        patches.append((fn, sampler_steps(name, x[..., start:stop, :], sigmas, view, model_sampling=ms)))
    results: list[torch.Tensor | None] = [None] * len(patches)
    pending = [(k, gen, fn, next(gen)) for k, (fn, gen) in enumerate(patches)]
    while pending:
        if order == "lockstep":  # every patch does one model call per round
            batch, pending = pending, []
        else:  # "sequential": the first patch runs to the end before the next one starts
            batch, pending = pending[:1], pending[1:]
        for k, gen, fn, call in batch:
            try:
                nxt = gen.send(fn(call.x, call.sigma))
            except StopIteration as done:
                results[k] = done.value
                continue
            item = (k, gen, fn, nxt)
            pending = [item, *pending] if order == "sequential" else [*pending, item]
    return torch.cat(results, dim=-2)


SPLIT_CASES = [
    ("euler_ancestral", "pixart", "generator"),
    ("euler_ancestral", "sd3", "generator"),
    ("heun", "pixart", "generator"),
    ("heun", "sd3", "generator"),
    ("dpm_2", "sd3", "generator"),
    ("dpmpp_2m_sde", "pixart", "generator"),
    ("dpmpp_2m_sde", "sd3", "generator"),
    ("dpmpp_2m_sde", "sd3", "default"),
    ("lcm", "pixart", "generator"),
    ("lcm", "sd3", "generator"),
]


@pytest.mark.parametrize(("name", "model", "noise_kind"), SPLIT_CASES)
def test_patch_split_equals_whole_latent(name: str, model: str, noise_kind: str) -> None:
    if noise_kind == "default" and not HAS_TORCHSDE:
        pytest.skip("Brownian-tree noise needs torchsde")
    whole = _split_run(name, model, [(0, 6)], "lockstep", noise_kind)
    for bands in ([(0, 2), (2, 6)], [(0, 3), (3, 4), (4, 6)]):
        for order in ("lockstep", "sequential"):
            split = _split_run(name, model, bands, order, noise_kind)
            torch.testing.assert_close(split, whole, rtol=0, atol=0)


def test_patch_split_matches_comfy_reference() -> None:
    """The split run reproduces ComfyUI's whole-latent result for an ancestral sampler."""
    case = next(
        c
        for c in REF["samplers"]
        if c["model"] == "pixart"
        and c["sampler"] == "euler_ancestral"
        and c["shape"] == [1, 3, 6, 6]
        and "eta" not in c
        and not c.get("img2img")
    )
    ms, shape, seed = build("pixart"), case["shape"], case["seed"]
    sigmas = sigmas_for_denoise(ms, case["scheduler"], case["steps"])
    x = noise_latent(ms, sigmas, initial_noise(seed, shape), torch.zeros(shape))
    shared = SharedNoise(default_noise("euler_ancestral", shape, sigmas, seed), shape)
    pat, bands = pattern(shape), (slice(0, 4), slice(4, 6))
    views = [shared.view(band) for band in bands]
    outs = []
    for band, view in zip(bands, views):  # patch 0 runs to the end first: patch 1 still gets the same draws
        fn = denoiser(ms, pat[..., band, :], case["omega"])
        outs.append(sample("euler_ancestral", fn, x[..., band, :], sigmas, view, model_sampling=ms))
    close(torch.cat(outs, dim=-2), tensor(case["output"]), rtol=1e-5, atol=1e-5)


def test_shared_noise_regions_and_misuse() -> None:
    shape = (1, 2, 4, 3)
    shared = SharedNoise(GeneratorNoise(shape, 3), shape)
    full, rows, cols = (
        shared.view(),
        shared.view(slice(1, 3)),
        shared.view((slice(None), slice(None), slice(None), slice(0, 2))),
    )
    s0, s1 = torch.tensor(2.0), torch.tensor(1.0)
    a = full(s0, s1)
    assert torch.equal(rows(s0, s1), a[:, :, 1:3]) and torch.equal(cols(s0, s1), a[..., 0:2])
    b = full(s1, torch.tensor(0.5))
    assert not torch.equal(a, b)
    with pytest.raises(ConfigError, match="same sampler"):
        rows(torch.tensor(5.0), s1)  # draw 1 was made for (1.0, 0.5)
    with pytest.raises(ConfigError, match="after noise was drawn"):
        shared.view((0, 1))
    with pytest.raises(ConfigError, match="full latent"):
        SharedNoise(GeneratorNoise((1, 2, 4, 4), 3), shape).view()(s0, s1)
    for bad in ((3, 9), (2, 2), "rows"):
        with pytest.raises(ConfigError, match="fix:"):
            SharedNoise(GeneratorNoise(shape, 3), shape).view(bad)


# ---- cfg ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", REF["cfg"], ids=lambda c: f"cfg={c['cfg']}")
def test_cfg_combine_matches_comfy(case: dict) -> None:
    close(cfg_combine(tensor(case["cond"]), tensor(case["uncond"]), case["cfg"]), tensor(case["result"]))


def test_cfg_one_skips_uncond() -> None:
    cond = torch.ones(2)
    assert not cfg_needs_uncond(1.0) and cfg_needs_uncond(4.5)
    assert torch.equal(cfg_combine(cond, None, 1.0), cond)
    with pytest.raises(ConfigError, match="unconditional"):
        cfg_combine(cond, None, 4.5)


# ---- errors ---------------------------------------------------------------------------------------------


def test_unknown_names_list_the_valid_ones() -> None:
    ms, x, sigmas = discrete_eps(), torch.zeros(1, 1, 2, 2), torch.tensor([1.0, 0.0])
    with pytest.raises(ConfigError, match="dpmpp_2m_sde") as err:
        sampler_steps("dpmpp_3m", x, sigmas, model_sampling=ms)
    assert "unknown sampler 'dpmpp_3m'" in str(err.value)
    with pytest.raises(ConfigError, match="ddim_uniform") as err:
        calculate_sigmas(ms, "linear_quadratic", 10)
    assert "unknown scheduler 'linear_quadratic'" in str(err.value)
    with pytest.raises(ConfigError, match="sqrt_linear"):
        discrete_eps(beta_schedule="cosine")


def test_bad_sampler_input_is_explained() -> None:
    ms, x, sigmas = flow_sd3(), torch.zeros(1, 1, 2, 2), torch.tensor([1.0, 0.5, 0.0])
    with pytest.raises(ConfigError, match="needs a noise sampler"):
        sampler_steps("euler_ancestral", x, sigmas, model_sampling=ms)
    with pytest.raises(ConfigError, match="has no eta"):
        sampler_steps("euler", x, sigmas, model_sampling=ms, eta=0.5)
    with pytest.raises(ConfigError, match="1-D tensor"):
        sampler_steps("euler", x, [1.0, 0.0], model_sampling=ms)
    with pytest.raises(ConfigError, match="model_sampling"):
        sampler_steps("euler", x, sigmas, model_sampling="flux")
    wrong_noise = GeneratorNoise((1, 1, 3, 2), 0)
    with pytest.raises(ConfigError, match="shape"):
        sample("euler_ancestral", lambda x, s: x * 0, x, sigmas, wrong_noise, model_sampling=ms)


def test_bad_schedule_input_is_explained() -> None:
    ms = flow_sd3()
    for steps in (0, 2.5, True):
        with pytest.raises(ConfigError, match="steps"):
            calculate_sigmas(ms, "simple", steps)
    with pytest.raises(ConfigError, match="denoise"):
        sigmas_for_denoise(ms, "simple", 10, 1.5)
    assert sigmas_for_denoise(ms, "simple", 10, 0.0).numel() == 0
    with pytest.raises(ConfigError, match="both"):
        flow_flux(width=1024)
    with pytest.raises(ConfigError, match="pixels"):
        flow_flux(1024, 0)
    with pytest.raises(ConfigError, match="shift"):
        flow_sd3(shift=-1.0)
    with pytest.raises(ConfigError, match="batch_index"):
        initial_noise(1, (2, 1, 2, 2), batch_index=[0])
    with pytest.raises(ConfigError, match="seed"):
        initial_noise(-1, (1, 1, 2, 2))
