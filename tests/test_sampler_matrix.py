"""Every sampler of ComfyUI 0.3.64 equals ComfyUI's own KSampler on a tiny Flux-structure file and a
tiny Wan file, to 1e-4 relative (L2), on one rank, Ulysses 2, CFG parallel 2 and PipeFusion 2; and the
Parallel Sampler node runs ComfyUI's SamplerCustom graphs (a SAMPLER from ComfyUI's sampler nodes with
its eta / s_noise / solver type, BasicScheduler's SIGMAS) to the same numbers.

Oracle: tests/data/comfy_sampler_matrix_reference.json, written by
tests/data/make_comfy_sampler_matrix_reference.py with ComfyUI's own nodes on the same files. Each
layout and model is one pool job that runs every sampler (tests/dist_jobs/sampler_jobs.py) on a warm
pool. PipeFusion runs with a warmup covering every step, so its attention is exact while every patch
still runs its own sampler (multistep history, SDE noise slices); dpm_adaptive is refused there with a
what/why/fix error.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.sampling import SAMPLER_NAMES, SAMPLERS
from parallel_runtime.service.load_job import load_model
from tests.dist_jobs.sampler_jobs import generate_each

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest, tiny_wan_state_dict  # noqa: E402

REF = json.loads((DATA / "comfy_sampler_matrix_reference.json").read_text(encoding="utf-8"))
TOLERANCE = 1e-4  # relative L2 (issue 24)
LAYOUTS = {
    "1rank": ParallelConfig(),
    "ulysses2": ParallelConfig(ulysses=2),
    "cfg2": ParallelConfig(cfg=2),
    "pipefusion2": ParallelConfig(pp=2),
}
KSAMPLER_CASES = [c for c in REF["cases"] if c["node"] == "KSampler"]
CUSTOM_CASES = [c for c in REF["cases"] if c["node"] == "SamplerCustom"]


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"])
    assert state_digest({"t": t}) == recipe["digest"], f"{recipe['name']} is not what the reference was made from"
    return t


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    from safetensors.torch import save_file

    info = REF["models"]["wan"]
    state = tiny_wan_state_dict(TinyWan(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny Wan weights differ from the reference's"
    wan = tmp_path_factory.mktemp("sampler-matrix") / "tiny_wan_matrix.safetensors"
    save_file(state, str(wan))
    return {"flux": DATA / REF["models"]["flux"]["file"], "wan": wan}


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


@functools.cache
def graph_inputs(model: str) -> tuple[list, list, dict]:
    """The CONDITIONING and LATENT the reference's ComfyUI graph used."""
    inputs = REF["inputs"][model]
    if model == "flux":
        pos, neg = (
            [[tensor(inputs[b]["embeds"]), {"pooled_output": tensor(inputs[b]["pooled"])}]]
            for b in ("positive", "negative")
        )
    else:
        pos, neg = [[generated(inputs["positive"]), {}]], [[generated(inputs["negative"]), {}]]
    return pos, neg, {"samples": tensor(inputs["latent"])}


def comfy_sampler(case: dict) -> SimpleNamespace:
    """A stand-in for the ComfyUI SAMPLER the reference's sampler node made: its sampling function's
    name, module and option defaults, and its options."""

    def function(model, x, sigmas, extra_args=None, callback=None, disable=None, eta=1.0, s_noise=1.0,
                 noise_sampler=None, r=0.5, solver_type="midpoint"):  # fmt: skip
        raise AssertionError("a stand-in: the workers run the sampler by name")

    function.__name__, function.__module__ = case["function"], case["module"]
    return SimpleNamespace(
        sampler_function=function, extra_options=case["extra_options"], inpaint_options=case["inpaint_options"]
    )


def load_node(ctx: NodeContext, path: Path):
    result = ParallelModelLoader(ctx).load(
        model=str(path),
        family="auto",
        devices="cpu:1",
        layout="manual",
        ulysses=1,
        ring=1,
        cfg_parallel=1,
        pipefusion=1,
        pp_patches=0,
        pp_warmup=1,
        dtype="fp32",
        attention="auto",
    )
    return result["result"][0]


def run_node(ctx: NodeContext, handle, model: str, case: dict) -> torch.Tensor:
    pos, neg, latent = graph_inputs(model)
    result = ParallelSampler(ctx).sample(
        handle,
        pos,
        neg,
        latent,
        case["seed"],
        case["steps"],
        case["cfg"],
        "euler",  # replaced by the SAMPLER
        "simple",  # replaced by the SIGMAS
        1.0,
        sigmas=tensor(case["sigmas"]),
        sampler=comfy_sampler(case),
    )
    return result["result"][0]["samples"]


def engine_inputs(model: str) -> tuple[Conditioning, Conditioning, torch.Tensor]:
    """The graph's CONDITIONING as the engine takes it; an empty 4-channel image latent widened as KSampler does."""
    pos, neg, latent = graph_inputs(model)
    conds = [Conditioning(c[0][0], c[0][1].get("pooled_output")) for c in (pos, neg)]
    samples = latent["samples"]
    if model == "flux" and samples.shape[1] != 16:
        samples = torch.zeros(samples.shape[0], 16, *samples.shape[2:])
    return conds[0], conds[1], samples


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got - expected).norm() / expected.norm())


def test_reference_covers_every_sampler():
    assert REF["names"]["samplers"] == SAMPLER_NAMES
    for model in ("flux", "wan"):
        assert [c["sampler"] for c in KSAMPLER_CASES if c["model"] == model] == SAMPLER_NAMES
    assert {c["scheduler"] for c in KSAMPLER_CASES} == set(REF["names"]["schedulers"])


@pytest.mark.parametrize("model", ["flux", "wan"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_sampler_equals_comfyui_ksampler(cpu_pool, files, layout, model):
    config = LAYOUTS[layout]
    pool = cpu_pool(config)
    pool.submit(load_model, str(files[model]), "fp32", "auto").result(300)
    cases = [c for c in KSAMPLER_CASES if c["model"] == model]
    runs = [{k: c[k] for k in ("seed", "steps", "cfg", "scheduler")} | {"sampler": c["sampler"]} for c in cases]
    pipefusion = {"patches": None, "warmup": max(c["steps"] for c in cases)} if config.pp > 1 else {}
    outputs = pool.submit(generate_each, *engine_inputs(model), runs, **pipefusion).result(1200)
    errors: dict[str, float] = {}
    for case, out in zip(cases, outputs, strict=True):
        if config.pp > 1 and not SAMPLERS[case["sampler"]].per_patch:
            assert isinstance(out, str) and "PipeFusion" in out and "fix:" in out, out
            continue
        assert isinstance(out, torch.Tensor), f"{case['sampler']}: {out}"
        errors[f"{case['sampler']}/{case['scheduler']}"] = relative_error(out, tensor(case["output"]))
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= TOLERANCE}
    assert not bad, f"{model} on {layout}: relative L2 error above {TOLERANCE} against ComfyUI's KSampler: {bad}"
    assert len(errors) == len(SAMPLER_NAMES) - sum(not SAMPLERS[n].per_patch for n in SAMPLER_NAMES) * (config.pp > 1)


@pytest.mark.parametrize("case", CUSTOM_CASES, ids=lambda c: f"{c['sampler_node']}-{c['function']}")
def test_sampler_custom_graphs_through_the_node(node_ctx, files, case):
    """SamplerCustom(SAMPLER from a ComfyUI sampler node, SIGMAS from BasicScheduler) -> the Parallel
    Sampler with the same SAMPLER and SIGMAS inputs gives ComfyUI's latent."""
    handle = load_node(node_ctx, files[case["model"]])
    error = relative_error(run_node(node_ctx, handle, case["model"], case), tensor(case["output"]))
    assert error <= TOLERANCE, f"{case['sampler_node']} {case['inputs']}: {error:.2e}"
