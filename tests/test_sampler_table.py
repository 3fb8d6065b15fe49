"""The sampler table against what its solvers do, and every sampler run patch by patch (PipeFusion).

- the generator protocol: which evaluations a sampler asks for, and the errors of a wrong driver;
- each table entry's ``calls`` (most model evaluations per step) and ``noise`` (whether it draws fresh
  noise) measured on the solvers themselves;
- every sampler that declares ``per_patch`` gives, run on row bands with SharedNoise views (in lockstep
  or one band to the end first), exactly the whole latent's result, which equals ComfyUI's stored one;
  dpm_adaptive, whose steps depend on the whole latent, does not, and PipeFusion refuses it.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from sampling_oracle import HAS_TORCHSDE, REF, build, close, guided_denoiser, tensor

from parallel_runtime.errors import ConfigError
from parallel_runtime.pipefusion.schedule import sampler_rounds
from parallel_runtime.sampling import (
    SAMPLER_NAMES,
    SAMPLERS,
    GeneratorNoise,
    Guided,
    SharedNoise,
    calculate_sigmas,
    default_noise,
    discrete_eps,
    final_sigma,
    initial_noise,
    noise_latent,
    sampler_steps,
    sampler_uses_noise,
    sigmas_for_denoise,
)

SPLIT_SHAPE = [1, 3, 6, 6]


def test_generator_protocol() -> None:
    """heun asks twice per step (not on the last step to sigma 0); the return value is the latent."""
    ms = discrete_eps()
    sigmas = calculate_sigmas(ms, "karras", 4)
    x = torch.randn(1, 2, 3, 3, generator=torch.Generator().manual_seed(0)) * sigmas[0]
    for name, expected in (
        ("euler", [(i, 0) for i in range(4)]),
        ("heun", [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]),
        ("seeds_3", [(i, k) for i in range(3) for k in range(3)] + [(3, 0)]),
    ):
        noise = default_noise(name, x.shape, sigmas, 0)
        gen = sampler_steps(name, x, sigmas, noise, model_sampling=ms)
        calls, call = [], next(gen)
        with pytest.raises(StopIteration) as done:
            while True:
                calls.append((call.step, call.stage))
                assert call.x.shape == x.shape and call.sigma.ndim == 0
                call = gen.send(call.x * 0.5)
        assert calls == expected
        assert done.value.value.shape == x.shape
    gen = sampler_steps("euler", x, sigmas, model_sampling=ms)
    next(gen)
    with pytest.raises(ConfigError, match="send"):
        next(gen)
    gen = sampler_steps("dpmpp_2m_cfg_pp", x, sigmas, model_sampling=ms)
    call = next(gen)
    with pytest.raises(ConfigError, match="unconditional"):
        gen.send(call.x)  # CFG++ needs Guided(denoised, uncond)


class CountingNoise:
    """A noise sampler that counts its draws (unit normals from a seeded generator)."""

    def __init__(self, shape):
        self.inner, self.draws = GeneratorNoise(shape, 3), 0

    def __call__(self, sigma, sigma_next):
        self.draws += 1
        return self.inner(sigma, sigma_next)


def _dry_run(name: str, model: str, scheduler: str, steps: int) -> tuple[Counter, int]:
    """(model calls per step, noise draws) of sampler ``name`` with the analytic guided network."""
    ms, shape = build(model), [1, 2, 4, 4]
    sigmas = sigmas_for_denoise(ms, scheduler, steps, sampler=name)
    case = {"sampler": name, "shape": shape, "omega": 0.003, "cfg": 2.0}
    fn, noise = guided_denoiser(ms, case), CountingNoise(shape)
    x = noise_latent(ms, sigmas, initial_noise(1, shape), torch.zeros(shape))
    gen = sampler_steps(name, x, sigmas, noise, model_sampling=ms)
    per_step: Counter = Counter()
    try:
        call = next(gen)
        while True:
            per_step[call.step] += 1
            call = gen.send(fn(call.x, call.sigma))
    except StopIteration:
        pass
    return per_step, noise.draws


@pytest.mark.parametrize("name", SAMPLER_NAMES)
def test_table_entry_is_what_the_solver_does(name: str) -> None:
    spec = SAMPLERS[name]
    most, draws = 0, 0
    for model, scheduler in (("pixart", "karras"), ("sd3", "simple")):
        per_step, drawn = _dry_run(name, model, scheduler, 7)
        most, draws = max(most, max(per_step.values())), draws + drawn
    assert most == spec.calls, f"{name}: at most {most} model calls in a step, the table says {spec.calls}"
    assert (draws > 0) == (spec.noise is not None) == sampler_uses_noise(name)
    assert set(spec.options) <= {"eta", "s_noise"}


def _split_run(case: dict, bands: list[tuple[int, int]], order: str, noise_kind: str = "default") -> torch.Tensor:
    """Run the case's sampler on row-band patches, each with its own generator and guided denoiser and a
    view of one shared full-latent noise."""
    name, shape, seed = case["sampler"], case["shape"], case["seed"]
    ms = build(case["model"])
    sigmas = sigmas_for_denoise(ms, case["scheduler"], case["steps"], sampler=name)
    sigmas = sigmas[: case["end_at"] + 1] if "end_at" in case else sigmas
    x = noise_latent(ms, sigmas, initial_noise(seed, shape), torch.zeros(shape))
    full = GeneratorNoise(shape, seed) if noise_kind == "generator" else default_noise(name, shape, sigmas, seed)
    shared = None if full is None else SharedNoise(full, shape)
    options = {k: case[k] for k in ("eta", "s_noise") if k in case}
    patches = []
    for start, stop in bands:
        view = None if shared is None else shared.view((start, stop))
        fn = guided_denoiser(ms, case, slice(start, stop))
        patches.append((fn, sampler_steps(name, x[..., start:stop, :], sigmas, view, model_sampling=ms, **options)))
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
    return ms.inverse_noise_scaling(final_sigma(name, sigmas), torch.cat(results, dim=-2))


PER_PATCH = [n for n in SAMPLER_NAMES if SAMPLERS[n].per_patch]


@pytest.mark.parametrize("model", ["pixart", "sd3"])
@pytest.mark.parametrize("name", PER_PATCH)
def test_patch_split_equals_whole_latent(name: str, model: str) -> None:
    if SAMPLERS[name].noise == "brownian" and not HAS_TORCHSDE:
        pytest.skip("Brownian-tree noise needs torchsde")
    scheduler = "karras" if model == "pixart" else "simple"
    case = {"sampler": name, "model": model, "scheduler": scheduler, "steps": 5, "shape": SPLIT_SHAPE}
    case.update(seed=7, omega=0.003, cfg=2.0)
    whole = _split_run(case, [(0, 6)], "lockstep")
    assert torch.isfinite(whole).all()
    for bands in ([(0, 2), (2, 6)], [(0, 3), (3, 4), (4, 6)]):
        for order in ("lockstep", "sequential"):
            torch.testing.assert_close(_split_run(case, bands, order), whole, rtol=0, atol=0)


def _reference(sampler: str, model: str, **match) -> dict:
    return next(
        c
        for c in REF["samplers"]
        if c["sampler"] == sampler and c["model"] == model and all(c.get(k) == v for k, v in match.items())
    )


@pytest.mark.parametrize(
    "case",
    [
        _reference("euler_ancestral", "pixart", shape=SPLIT_SHAPE, denoise=1.0, scheduler="normal"),
        _reference("euler_ancestral_cfg_pp", "flux_768x1344"),
        _reference("dpmpp_3m_sde", "sd3", shape=[2, 2, 4, 4]),
        _reference("seeds_3", "pixart", shape=[2, 2, 4, 4]),
        _reference("sa_solver", "sd3", end_at=4),
        _reference("uni_pc", "flux", end_at=4),
        _reference("er_sde", "pixart"),
    ],
    ids=lambda c: f"{c['sampler']}-{c['model']}",
)
def test_patch_split_matches_comfy_reference(case: dict) -> None:
    """Split runs (the first patch to the end first) reproduce ComfyUI's whole-latent result."""
    if SAMPLERS[case["sampler"]].noise == "brownian" and not HAS_TORCHSDE:
        pytest.skip("Brownian-tree noise needs torchsde")
    rows = case["shape"][-2]
    split = _split_run(case, [(0, rows // 2), (rows // 2, rows)], "sequential", case.get("noise", "default"))
    close(split, tensor(case["output"]), rtol=1e-5, atol=1e-5)


def test_dpm_adaptive_depends_on_the_whole_latent() -> None:
    """Its error norm spans the whole latent, so patches would choose their own steps: PipeFusion refuses it."""
    case = {"sampler": "dpm_adaptive", "model": "pixart", "scheduler": "karras", "steps": 5, "shape": SPLIT_SHAPE}
    case.update(seed=7, omega=0.003, cfg=2.0)
    whole = _split_run(case, [(0, 6)], "lockstep")
    assert not torch.equal(_split_run(case, [(0, 2), (2, 6)], "lockstep"), whole)
    ms = build("pixart")
    with pytest.raises(ConfigError, match="dpm_adaptive") as err:
        sampler_rounds("dpm_adaptive", calculate_sigmas(ms, "karras", 5), ms)
    assert "PipeFusion" in str(err.value)


def test_guided_answer_reaches_cfg_pp_only() -> None:
    """A Guided answer is accepted by every sampler; only CFG++ reads its unconditional part."""
    ms, shape = build("sd3"), [1, 2, 4, 4]
    sigmas = calculate_sigmas(ms, "simple", 4)
    x = noise_latent(ms, sigmas, initial_noise(2, shape), torch.zeros(shape))

    def run(name: str, uncond_scale: float) -> torch.Tensor:
        gen = sampler_steps(name, x, sigmas, model_sampling=ms)
        try:
            call = next(gen)
            while True:
                call = gen.send(Guided(call.x * 0.5, call.x * uncond_scale))
        except StopIteration as done:
            return done.value

    assert torch.equal(run("euler", 0.1), run("euler", 0.9))
    assert not torch.equal(run("euler_cfg_pp", 0.1), run("euler_cfg_pp", 0.9))
