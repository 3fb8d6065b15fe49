"""parallel_runtime.sampling against numbers produced by ComfyUI's own code.

The reference (tests/data/comfy_sampling_reference.json) is made by
tests/data/make_comfy_sampling_reference.py, which runs ComfyUI 0.3.64's schedulers, model sampling
objects, KSampler sigmas, every sampler (through KSAMPLER.sample, guided by ComfyUI's own
sampling_function) and noise functions; the analytic network is in tests/sampling_oracle.py.
"""

from __future__ import annotations

import pytest
import torch
from sampling_oracle import (  # tests/ helper
    HAS_TORCHSDE,
    REF,
    build,
    close,
    guided_denoiser,
    img2img_latent,
    tensor,
)

from parallel_runtime.errors import ConfigError
from parallel_runtime.sampling import (
    SAMPLER_NAMES,
    SAMPLERS,
    SCHEDULER_NAMES,
    BrownianTreeNoise,
    GeneratorNoise,
    SharedNoise,
    calculate_sigmas,
    cfg_combine,
    cfg_needs_uncond,
    default_noise,
    discrete_eps,
    drops_penultimate_sigma,
    final_sigma,
    flow_flux,
    flow_sd3,
    flux_shift,
    initial_noise,
    noise_latent,
    sample,
    sampler_steps,
    sigmas_for_denoise,
)

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


def test_names_are_comfy_s_lists() -> None:
    """The sampler and scheduler lists are ComfyUI 0.3.64's, in its order, as lists (what its node
    validation needs), and the reference covers every entry."""
    assert REF["names"]["samplers"] == SAMPLER_NAMES and isinstance(SAMPLER_NAMES, list)
    assert REF["names"]["schedulers"] == SCHEDULER_NAMES and isinstance(SCHEDULER_NAMES, list)
    assert len(SAMPLER_NAMES) == 42 and len(SCHEDULER_NAMES) == 9
    assert {s for _, s in _scheduler_groups()} == set(SCHEDULER_NAMES)
    assert {n for n in SAMPLER_NAMES if drops_penultimate_sigma(n)} == set(REF["discard_penultimate_sigma_samplers"])


@pytest.mark.parametrize(("model", "scheduler"), _scheduler_groups())
def test_scheduler_matches_comfy(model: str, scheduler: str) -> None:
    """Each scheduler's table (5 model samplings x steps 1, 2, 3, 10, 25) equals ComfyUI's."""
    ms = build(model)
    for entry in (e for e in REF["schedulers"] if e["model"] == model and e["scheduler"] == scheduler):
        if entry.get("comfy_nan"):  # kl_optimal, 1 step: ComfyUI divides by steps - 1
            with pytest.raises(ConfigError, match="kl_optimal"):
                calculate_sigmas(ms, scheduler, entry["steps"])
            continue
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
    extras = "-".join(
        f"{k}={case[k]}"
        for k in ("denoise", "eta", "s_noise", "noise", "cfg", "negative", "end_at")
        if k in case and case[k] not in (1.0, True)
    )
    return f"{case['model']}-{case['sampler']}-{case['scheduler']}-{case['steps']}-{case['shape'][0]}x{case['shape'][-1]}{'-' + extras if extras else ''}"


def test_reference_covers_every_sampler() -> None:
    covered = {c["sampler"] for c in REF["samplers"]}
    assert covered == set(SAMPLER_NAMES)
    for name in SAMPLER_NAMES:  # each on an epsilon model and on two flow models
        assert {c["model"] for c in REF["samplers"] if c["sampler"] == name} >= {"pixart", "sd3", "flux_768x1344"}


def _schedule(case: dict) -> torch.Tensor:
    ms = build(case["model"])
    sigmas = sigmas_for_denoise(ms, case["scheduler"], case["steps"], case["denoise"], sampler=case["sampler"])
    if "end_at" in case:  # KSamplerAdvanced's window that keeps the leftover noise
        sigmas = sigmas[: case["end_at"] + 1]
    close(sigmas, tensor(case["sigmas"]))
    return sigmas


def _run_case(case: dict, callback=None) -> torch.Tensor:
    ms, shape, seed = build(case["model"]), case["shape"], case["seed"]
    sigmas = _schedule(case)
    latent = img2img_latent(shape) if case.get("img2img") else torch.zeros(shape)
    x = noise_latent(ms, sigmas, initial_noise(seed, shape), latent)
    if case.get("noise") == "generator":
        noise = GeneratorNoise(shape, seed)
    else:
        noise = default_noise(case["sampler"], tuple(shape), sigmas, seed)
    options = {k: case[k] for k in ("eta", "s_noise") if k in case}
    out = sample(
        case["sampler"], guided_denoiser(ms, case), x, sigmas, noise, model_sampling=ms, callback=callback, **options
    )
    return ms.inverse_noise_scaling(final_sigma(case["sampler"], sigmas), out)


def _needs_torchsde(case: dict) -> bool:
    return SAMPLERS[case["sampler"]].noise == "brownian" and case.get("noise") != "generator"


# ComfyUI reports these samplers' progress at other points than the first evaluation of a step
CALLBACK_ELSEWHERE = {"uni_pc", "uni_pc_bh2", "dpm_adaptive"}
# ... and these report the start latent as every step's x (only their predictions are comparable)
CALLBACK_START_X = {"ipndm", "ipndm_v", "deis"}


@pytest.mark.parametrize("case", REF["samplers"], ids=_case_id)
def test_sampler_matches_comfy(case: dict) -> None:
    if _needs_torchsde(case) and not HAS_TORCHSDE:
        pytest.skip("ComfyUI's default SDE noise is a torchsde Brownian tree; torchsde is not installed")
    seen: list[dict] = []

    def callback(i: int, x: torch.Tensor, denoised: torch.Tensor) -> None:
        seen.append({"i": i, "x_mean": x.double().mean().item(), "denoised_mean": denoised.double().mean().item()})

    out = _run_case(case, callback)
    close(out, tensor(case["output"]), rtol=1e-5, atol=1e-5)
    if case["sampler"] in CALLBACK_ELSEWHERE:
        return
    assert [s["i"] for s in seen] == [s["i"] for s in case["callback"]]
    for ours, theirs in zip(seen, case["callback"]):
        if case["sampler"] not in CALLBACK_START_X:
            assert ours["x_mean"] == pytest.approx(theirs["x_mean"], rel=1e-5, abs=1e-5)
        assert ours["denoised_mean"] == pytest.approx(theirs["denoised_mean"], rel=1e-5, abs=1e-5)


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
    with pytest.raises(ConfigError, match="kl_optimal") as err:
        calculate_sigmas(ms, "align_your_steps", 10)
    assert "unknown scheduler 'align_your_steps'" in str(err.value)
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
    with pytest.raises(ConfigError, match="CFG\\+\\+"):
        sample("res_multistep_cfg_pp", lambda x, s: x * 0, x, sigmas, model_sampling=ms)
    with pytest.raises(ConfigError, match="seeds_2"):  # the error lists the samplers that take eta
        sampler_steps("er_sde", x, sigmas, GeneratorNoise(x.shape, 0), model_sampling=ms, eta=0.5)


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
