"""Regenerate tests/data/comfy_sampling_reference.json by running ComfyUI's OWN sampling code.

Run by hand (not in CI), from any directory, with a Python that has torch, numpy, scipy, tqdm,
einops, psutil and torchsde (ComfyUI's sampling imports), e.g. the tests' ComfyUI venv
(tests/comfyui/comfy_env.py builds it under ~/.cache/dit-parallel):

    PYTHONDONTWRITEBYTECODE=1 ~/.cache/dit-parallel/comfyui-venv-*/bin/python \
        tests/data/make_comfy_sampling_reference.py /work/shared/ComfyUI \
        --commit a125cd84b054a57729b5eecab930ca9408719832

What it stores: ComfyUI's sampler and scheduler name lists; every scheduler on five model samplings at
five step counts; KSampler's sigmas for denoise < 1 and the samplers that drop the penultimate sigma;
every sampler through ComfyUI's own ``KSAMPLER.sample`` (its noise samplers, flow branches, final-step
rules) with ComfyUI's own ``sampling_function`` doing the guidance (its cfg-1 skip and the post-CFG
hooks the CFG++ samplers read) over two analytic branch "networks"; noise and CFG functions.

Heavy ComfyUI imports that sampling never uses (torchvision, av, ...) are stubbed when missing.
Nothing from parallel_runtime is imported (only the sibling comfy_setup.py): every number comes from ComfyUI's functions.
The test's analytic "network" is defined here and in tests/test_sampling.py (keep them identical).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_setup import prepare_comfy, tensor_json  # noqa: E402 (the sibling helper, found through this folder)
from sampling_reference_cases import extra_cases, matrix_cases  # noqa: E402

SHAPE = [1, 3, 6, 6]
SEED = 42
SCHEDULER_STEPS = (1, 2, 3, 10, 25)


def import_comfy(comfy_dir: Path) -> SimpleNamespace:
    stubbed = prepare_comfy(comfy_dir)
    import comfy.k_diffusion.sampling as kds
    import comfy.model_base
    import comfy.model_sampling
    import comfy.sample
    import comfy.samplers
    import comfy.supported_models
    import comfy_extras.nodes_model_advanced as nma

    return SimpleNamespace(
        kds=kds,
        model_base=comfy.model_base,
        model_sampling=comfy.model_sampling,
        sample=comfy.sample,
        samplers=comfy.samplers,
        supported=comfy.supported_models,
        nma=nma,
        stubbed=stubbed,
    )


def scalar(v) -> float:
    return float(f"{float(v):.9g}")


# ---- the analytic "network" (identical copy in tests/test_sampling.py) ----------------------------------


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


# ---- model sampling objects -----------------------------------------------------------------------------


class FakeConfig:
    def __init__(self, sampling_settings: dict):
        self.sampling_settings = dict(sampling_settings)


class FakePatcher:
    """Just enough of a ModelPatcher for KSampler and the ModelSamplingFlux node."""

    def __init__(self, model_sampling, model_config=None):
        self.objects = {"model_sampling": model_sampling}
        self.model = SimpleNamespace(model_config=model_config)

    def get_model_object(self, name):
        return self.objects[name]

    def clone(self):
        return FakePatcher(self.objects["model_sampling"], self.model.model_config)

    def add_object_patch(self, name, obj):
        self.objects[name] = obj


def build_models(c: SimpleNamespace) -> dict:
    mt = c.model_base.ModelType
    sup = c.supported
    models = {
        "pixart": (
            c.model_base.model_sampling(FakeConfig(sup.PixArtAlpha.sampling_settings), mt.EPS),
            {"kind": "discrete_eps", "args": {}},
        ),
        "sd15_linear": (
            c.model_base.model_sampling(FakeConfig(sup.SD15.sampling_settings), mt.EPS),
            {"kind": "discrete_eps", "args": {"beta_schedule": "linear", "linear_start": 0.00085, "linear_end": 0.012}},
        ),
        "sd3": (
            c.model_base.model_sampling(FakeConfig(sup.SD3.sampling_settings), mt.FLOW),
            {"kind": "flow_sd3", "args": {}},
        ),
        "flux": (
            c.model_base.model_sampling(FakeConfig(sup.Flux.sampling_settings), mt.FLUX),
            {"kind": "flow_flux", "args": {}},
        ),
    }
    flux_config = FakeConfig(sup.Flux.sampling_settings)
    base = FakePatcher(c.model_base.model_sampling(flux_config, mt.FLUX), flux_config)
    for (w, h), (base_shift, max_shift) in {
        (512, 512): (0.5, 1.15),
        (768, 1344): (0.5, 1.15),
        (1920, 1088): (0.5, 1.15),
        (640, 384): (0.3, 1.3),
    }.items():
        (patched,) = c.nma.ModelSamplingFlux().patch(base, max_shift, base_shift, w, h)
        args = {"width": w, "height": h, "base_shift": base_shift, "max_shift": max_shift}
        models[f"flux_{w}x{h}"] = (patched.get_model_object("model_sampling"), {"kind": "flow_flux", "args": args})
    return models


def model_sampling_reference(c: SimpleNamespace, ms) -> dict:
    gen = torch.Generator().manual_seed(1)
    n = len(ms.sigmas)
    idx = sorted({0, 1, 2, n // 3, n // 2, n - 2, n - 1} | set(range(0, n, max(1, n // 40))))
    probe_sigmas = torch.tensor([float(ms.sigma_min), 0.05, 0.3, 0.7, 0.95, 1.0, 3.0, float(ms.sigma_max)])
    probe_sigmas = probe_sigmas[probe_sigmas <= float(ms.sigma_max)]
    is_flux = isinstance(ms, c.model_sampling.ModelSamplingFlux)
    t_max = 1.0 if is_flux else float(ms.timestep(ms.sigma_max))
    probe_t = torch.tensor([0.0, 0.25, 0.5, 0.37, 0.999, 1.0]) * t_max
    if not is_flux:
        probe_t = torch.cat([probe_t, torch.tensor([-3.0, 17.0, 17.4, 400.5, 998.2, 1200.0])])
    x = torch.randn(2, 3, 2, 2, generator=gen)
    out = torch.randn(2, 3, 2, 2, generator=gen)
    latent = torch.randn(2, 3, 2, 2, generator=gen)
    s_one = torch.tensor(0.6)
    s_batch = torch.tensor([0.8, 0.25])
    ref = {
        "sigma_min": scalar(ms.sigma_min),
        "sigma_max": scalar(ms.sigma_max),
        "num_sigmas": n,
        "table_index": idx,
        "table": [scalar(ms.sigmas[i]) for i in idx],
        "timestep_in": tensor_json(probe_sigmas),
        "timestep_out": tensor_json(ms.timestep(probe_sigmas).float()),
        "sigma_in": tensor_json(probe_t),
        "sigma_out": tensor_json(torch.stack([torch.as_tensor(ms.sigma(t)) for t in probe_t])),
        "percent_in": [0.0, 1e-4, 0.2, 0.5, 0.9, 1.0],
        "percent_out": [scalar(ms.percent_to_sigma(p)) for p in [0.0, 1e-4, 0.2, 0.5, 0.9, 1.0]],
        "x": tensor_json(x),
        "model_output": tensor_json(out),
        "latent": tensor_json(latent),
        "sigma_one": scalar(s_one),
        "sigma_batch": tensor_json(s_batch),
    }
    for tag, s in (("one", s_one), ("batch", s_batch)):
        ref[f"calculate_input_{tag}"] = tensor_json(ms.calculate_input(s, x))
        ref[f"calculate_denoised_{tag}"] = tensor_json(ms.calculate_denoised(s, out, x))
        ref[f"noise_scaling_{tag}"] = tensor_json(ms.noise_scaling(s, x.clone(), latent, max_denoise=False))
        ref[f"noise_scaling_max_{tag}"] = tensor_json(ms.noise_scaling(s, x.clone(), latent, max_denoise=True))
        ref[f"inverse_noise_scaling_{tag}"] = tensor_json(ms.inverse_noise_scaling(s, x))
    if hasattr(ms, "shift"):
        ref["shift"] = float(ms.shift)
    return ref


# ---- schedulers -----------------------------------------------------------------------------------------


def scheduler_reference(c: SimpleNamespace, models: dict) -> tuple[list, list]:
    plain = []
    for model in ("pixart", "sd15_linear", "sd3", "flux", "flux_768x1344"):
        ms = models[model][0]
        for name in c.samplers.SCHEDULER_NAMES:
            for steps in SCHEDULER_STEPS:
                sigmas = c.samplers.calculate_sigmas(ms, name, steps)
                entry = {"model": model, "scheduler": name, "steps": steps}
                if torch.isnan(sigmas).any():  # kl_optimal with 1 step divides by steps - 1
                    entry["comfy_nan"] = True
                else:
                    entry["sigmas"] = tensor_json(sigmas)
                plain.append(entry)
    ksampler = []
    cases = [
        ("pixart", "normal", 10, 0.6, "euler"),
        ("pixart", "karras", 20, 0.35, "euler_ancestral"),
        ("pixart", "beta", 8, 0.5, "dpm_2"),
        ("pixart", "simple", 12, 1.0, "dpm_2"),
        ("sd3", "simple", 10, 0.75, "euler"),
        ("sd3", "sgm_uniform", 9, 0.3, "dpm_2"),
        ("flux", "beta", 15, 0.8, "heun"),
        ("flux_512x512", "ddim_uniform", 6, 0.5, "lcm"),
        ("flux", "exponential", 4, 0.0, "euler"),
        ("sd3", "normal", 5, 0.99995, "euler"),
        ("pixart", "karras", 6, 1.0, "uni_pc"),
        ("sd3", "linear_quadratic", 7, 0.6, "uni_pc_bh2"),
        ("flux", "kl_optimal", 5, 1.0, "dpm_2_ancestral"),
        ("pixart", "linear_quadratic", 9, 1.0, "heunpp2"),
        ("flux_768x1344", "kl_optimal", 8, 0.45, "res_multistep"),
    ]
    for model, scheduler, steps, denoise, sampler in cases:
        ks = c.samplers.KSampler(
            FakePatcher(models[model][0]), steps, "cpu", sampler=sampler, scheduler=scheduler, denoise=denoise
        )
        ksampler.append(
            {
                "model": model,
                "scheduler": scheduler,
                "steps": steps,
                "denoise": denoise,
                "sampler": sampler,
                "sigmas": tensor_json(ks.sigmas),
            }
        )
    return plain, ksampler


# ---- samplers -------------------------------------------------------------------------------------------


class FakeBaseModel:
    """BaseModel._apply_model with the analytic network of one branch."""

    def __init__(self, ms, omega: float, pat: torch.Tensor):
        self.model_sampling, self.omega, self.pat = ms, omega, pat

    def __call__(self, x, sigma):
        ms = self.model_sampling
        xc = ms.calculate_input(sigma, x)
        t = ms.timestep(sigma).float()
        return ms.calculate_denoised(sigma, analytic_network(xc, t, self.pat, self.omega).float(), x)


class GuidedModel:
    """What KSAMPLER.sample and the samplers see as the model (CFGGuider's place): ComfyUI's own
    ``sampling_function`` (its cfg-1 skip, ``cfg_function`` and the post-CFG hooks CFG++ reads), with the
    branch predictions from the analytic networks (a ``sampler_calc_cond_batch_function``)."""

    def __init__(self, c: SimpleNamespace, ms, omega: float, shape, cfg: float, negative: bool):
        self.c, self.cfg = c, cfg
        self.inner_model = FakeBaseModel(ms, omega, pattern(shape))
        self.uncond_model = FakeBaseModel(ms, omega, uncond_pattern(shape))
        self.model_patcher = FakePatcher(ms)
        self.cond, self.uncond = [{}], ([{}] if negative else None)

    def branches(self, args):
        x, sigma = args["input"], args["sigma"]
        nets = (self.inner_model, self.uncond_model)
        return [net(x, sigma) if conds is not None else torch.zeros_like(x) for net, conds in zip(nets, args["conds"])]

    def __call__(self, x, sigma, model_options=None, seed=None):
        options = {**(model_options or {}), "sampler_calc_cond_batch_function": self.branches}
        return self.c.samplers.sampling_function(
            self.inner_model, x, sigma, self.uncond, self.cond, self.cfg, options, seed
        )


def omega_for(model: str) -> float:
    return 3.0 if model.startswith("flux") else 0.003


def sampler_reference(c: SimpleNamespace, models: dict) -> list:
    out = []
    for case in matrix_cases(c.samplers.SAMPLER_NAMES, c.samplers.SCHEDULER_NAMES) + extra_cases():
        case = {"denoise": 1.0, "shape": SHAPE, "cfg": 1.0, "negative": True, **case}
        case["seed"] = SEED + len(out)
        case["omega"] = omega_for(case["model"])
        ms = models[case["model"]][0]
        shape = case["shape"]
        latent = img2img_latent(shape) if case.get("img2img") else torch.zeros(shape)
        noise = c.sample.prepare_noise(latent, case["seed"])
        ks = c.samplers.KSampler(
            FakePatcher(ms),
            case["steps"],
            "cpu",
            sampler=case["sampler"],
            scheduler=case["scheduler"],
            denoise=case["denoise"],
        )
        sigmas = ks.sigmas
        if "end_at" in case:  # KSampler.sample's cut without force_full_denoise
            sigmas = sigmas[: case["end_at"] + 1]
        case["sigmas"] = tensor_json(sigmas)  # before the sampler runs (uni_pc changes its last entry)
        extra = {k: case[k] for k in ("eta", "s_noise") if k in case}
        if case.get("noise") == "generator":
            extra["noise_sampler"] = c.kds.default_noise_sampler(noise, seed=case["seed"])
        sampler = c.samplers.sampler_object(case["sampler"])
        sampler.extra_options = {**sampler.extra_options, **extra}
        model = GuidedModel(c, ms, case["omega"], shape, case["cfg"], case["negative"])
        steps_seen = []

        def callback(i, denoised, x, total, steps_seen=steps_seen):
            steps_seen.append(
                {"i": i, "x_mean": scalar(x.double().mean()), "denoised_mean": scalar(denoised.double().mean())}
            )

        with torch.no_grad():
            result = sampler.sample(
                model,
                sigmas,
                {"seed": case["seed"], "model_options": {}},
                callback,
                noise,
                latent_image=latent,
                disable_pbar=True,
            )
        if not torch.isfinite(result).all():
            raise SystemExit(f"ComfyUI's result is not finite for {case}")
        case["callback"] = steps_seen
        case["output"] = tensor_json(result)
        out.append(case)
    return out


# ---- noise and cfg --------------------------------------------------------------------------------------


def noise_reference(c: SimpleNamespace) -> dict:
    latent = torch.zeros(2, 3, 4, 5)
    plain = c.sample.prepare_noise(latent, 123)
    batch_latent = torch.zeros(3, 2, 2, 3)
    inds = [2, 0, 2]
    indexed = c.sample.prepare_noise(batch_latent, 99, inds)
    like = torch.zeros(1, 2, 3, 4)
    default = c.kds.default_noise_sampler(like, seed=7)
    default_draws = [default(torch.tensor(1.0), torch.tensor(0.5)) for _ in range(2)]
    tree_x = torch.zeros(2, 2, 3, 3)
    tree = c.kds.BrownianTreeNoiseSampler(tree_x, torch.tensor(0.03), torch.tensor(14.6), seed=5, cpu=True)
    pairs = [(14.6, 7.0), (7.0, 2.0), (2.0, 0.03), (3.0, 5.0)]
    tree_draws = [tree(torch.tensor(a), torch.tensor(b)) for a, b in pairs]
    return {
        "prepare_noise": {"seed": 123, "shape": list(latent.shape), "noise": tensor_json(plain)},
        "prepare_noise_batch_index": {
            "seed": 99,
            "shape": list(batch_latent.shape),
            "batch_index": inds,
            "noise": tensor_json(indexed),
        },
        "default_noise_sampler": {
            "seed": 7,
            "shape": list(like.shape),
            "draws": [tensor_json(d) for d in default_draws],
        },
        "brownian_tree": {
            "seed": 5,
            "shape": list(tree_x.shape),
            "sigma_min": 0.03,
            "sigma_max": 14.6,
            "pairs": pairs,
            "draws": [tensor_json(d) for d in tree_draws],
        },
    }


def cfg_reference(c: SimpleNamespace) -> list:
    gen = torch.Generator().manual_seed(3)
    cond, uncond, x = (torch.randn(2, 3, 4, generator=gen) for _ in range(3))
    out = []
    for scale in (1.0, 4.5, 7.0):
        res = c.samplers.cfg_function(None, cond, uncond, scale, x, torch.tensor([0.5, 0.5]), model_options={})
        out.append({"cfg": scale, "cond": tensor_json(cond), "uncond": tensor_json(uncond), "result": tensor_json(res)})
    return out


def to_json(obj, indent: int = 0) -> str:
    """JSON with one key per line but lists of numbers kept on one line (readable diffs, small file)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        items = [f"{inner}{json.dumps(k)}: {to_json(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    if isinstance(obj, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in obj):
        items = [f"{inner}{to_json(v, indent + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, separators=(",", ":"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comfyui", type=Path, help="ComfyUI checkout (the folder with comfy/ and nodes.py)")
    parser.add_argument("--commit", default=None, help="ComfyUI git commit, if the checkout has no .git")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("comfy_sampling_reference.json"))
    args = parser.parse_args()
    comfy_dir = args.comfyui.resolve()
    commit = args.commit
    if commit is None:
        commit = (
            subprocess.run(
                ["git", "-C", str(comfy_dir), "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    version_ns: dict = {}
    exec((comfy_dir / "comfyui_version.py").read_text(), version_ns)

    torch.set_num_threads(1)
    c = import_comfy(comfy_dir)
    models = build_models(c)
    lists = {"samplers": list(c.samplers.SAMPLER_NAMES), "schedulers": list(c.samplers.SCHEDULER_NAMES)}
    plain, ksampler = scheduler_reference(c, models)
    ref = {
        "source": {
            "comfyui_version": version_ns.get("__version__"),
            "comfyui_commit": commit,
            "torch": torch.__version__,
            "stubbed_imports": c.stubbed,
            "generator": "tests/data/make_comfy_sampling_reference.py",
        },
        "names": lists,
        "discard_penultimate_sigma_samplers": sorted(c.samplers.KSampler.DISCARD_PENULTIMATE_SIGMA_SAMPLERS),
        "models": {name: spec for name, (_, spec) in models.items()},
        "model_sampling": {name: model_sampling_reference(c, ms) for name, (ms, _) in models.items()},
        "schedulers": plain,
        "ksampler_sigmas": ksampler,
        "samplers": sampler_reference(c, models),
        "noise": noise_reference(c),
        "cfg": cfg_reference(c),
    }
    args.out.write_text(to_json(ref) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
