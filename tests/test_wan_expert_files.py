"""Wan 2.2 A14B from two single files held in ONE pool (``LoadRequest.expert_2``): both experts stay loaded
and sampling switches at the boundary, so the two no longer evict each other. Oracle: ComfyUI 0.3.64's own
two-pass graph on the same two files (KSamplerAdvanced high noise steps 0-2 with leftover noise, low noise
2-end; stored by tests/data/make_comfy_wan_reference.py) equals one Parallel sample with the boundary between
the second and third sigma, on Ulysses 2, three prompts on one load. Wrong pairs fail on the host."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise import SamplingSettings, model_sampling_for
from parallel_runtime.denoise.loop import schedule
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.single_file import load_single_file_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from wan_tiny_weights import TinyWan, hashed_uniform, state_digest, tiny_wan_state_dict  # noqa: E402

REF = json.loads((DATA / "comfy_wan_reference.json").read_text())
CASE = REF["two_pass"]


def _tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def _generated(recipe: dict) -> torch.Tensor:
    t = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"], recipe.get("offset", 0.0))
    assert state_digest({"t": t}) == recipe["digest"]
    return t


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """ComfyUI-layout files of the reference's high / low experts (and the I2V model, another shape)."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("wan-experts")
    out = {}
    for name, info in (("high", CASE["high"]), ("low", CASE["low"]), ("i2v", REF["i2v"]["model"])):
        state = tiny_wan_state_dict(TinyWan(**info["config"]), info["salt"])
        assert state_digest(state) == info["digest"]
        out[name] = folder / f"wan2.2_{name}_noise.safetensors"
        save_file({f"model.diffusion_model.{k}": v for k, v in state.items()}, str(out[name]))
    return out


def _boundary(path: Path, steps: int) -> float:
    """A sigma between the schedule's 2nd and 3rd: the high expert takes steps 0-1, the low one 2-end."""
    adapter = load_single_file_components(path, "cpu", torch.float32).adapter()
    settings = SamplingSettings(seed=0, steps=steps, sampler="euler", scheduler="simple")
    sigmas = schedule(model_sampling_for(adapter), settings)
    return float(sigmas[1] + sigmas[2]) / 2


def test_two_expert_files_in_one_pool_equal_comfyui_two_passes(pool_registry, files):
    request = LoadRequest(
        str(files["high"]),
        "cpu:2",
        ParallelConfig(ulysses=2),
        expert_2=str(files["low"]),
        expert_boundary=_boundary(files["high"], CASE["steps"]),
        threads_per_worker=1,
    )
    model = load_parallel_model(request, pool_registry)
    assert model.info["experts"] == 2
    pool, generation = model.pool, model._loaded.generation
    pos, neg = Conditioning(_generated(CASE["positive"])), Conditioning(_generated(CASE["negative"]))
    latent, expected = _tensor(CASE["latent"]), _tensor(CASE["output"])
    args = {"steps": CASE["steps"], "cfg": CASE["cfg"], "sampler_name": "euler", "scheduler": "simple"}
    outs = [model.sample(pos, neg, latent, 64, 64, seed=seed, **args) for seed in (CASE["seed"], 3, CASE["seed"])]
    err = ((outs[0] - expected).norm() / expected.norm()).item()
    assert err <= 1e-4, f"relative L2 error {err:.2e} against ComfyUI's two passes"
    assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])
    assert model.pool is pool and not pool.closed and model._loaded.generation == generation  # never reloaded


def test_wrong_second_experts_fail_on_the_host(pool_registry, files):
    def load(**fields):
        layout = fields.pop("layout", ParallelConfig(ulysses=2))
        return load_parallel_model(LoadRequest(str(files["high"]), "cpu:2", layout, **fields), pool_registry)

    with pytest.raises(ConfigError, match="differs from the model in in_channels"):
        load(expert_2=str(files["i2v"]))
    with pytest.raises(ConfigError, match="second expert file with the layout"):
        load(expert_2=str(files["low"]), layout=ParallelConfig(pp=2))
    with pytest.raises(ConfigError, match="expert boundary"):
        load(expert_2=str(files["low"]), expert_boundary=1.5)
