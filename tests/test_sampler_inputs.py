"""What the sampler nodes offer and accept: ComfyUI's sampler and scheduler lists (as lists, same order),
a ComfyUI SAMPLER read as a sampler name and its noise options, and the host-side refusals (before any
worker runs) of options a sampler lacks, a 1-step kl_optimal schedule and dpm_adaptive under PipeFusion."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pack_import import load_pack  # tests/ helper

from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.sampling import SAMPLER_NAMES, SCHEDULER_NAMES
from parallel_runtime.service.comfy_sampler import sampler_from_input
from parallel_runtime.service.sampling_checks import check_sampler_for_layout, check_sampling_args

load_pack()
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.sampler_advanced import ParallelSamplerAdvanced  # noqa: E402

REF = json.loads((Path(__file__).parent / "data" / "comfy_sampling_reference.json").read_text())


def test_node_choices_are_comfyuis_lists():
    """ComfyUI validates a combo value only when the choices are a list: ours are ComfyUI 0.3.64's lists."""
    for node in (ParallelSampler, ParallelSamplerAdvanced):
        required = node.INPUT_TYPES()["required"]
        samplers, schedulers = required["sampler_name"][0], required["scheduler"][0]
        assert isinstance(samplers, list) and isinstance(schedulers, list)
        assert samplers == REF["names"]["samplers"] == SAMPLER_NAMES
        assert schedulers == REF["names"]["schedulers"] == SCHEDULER_NAMES
    assert ParallelSampler.INPUT_TYPES()["optional"]["sampler"][0] == "SAMPLER"


def comfy_sampler(name: str, module: str = "comfy.k_diffusion.sampling", extra=None, inpaint=None):
    """A ComfyUI KSAMPLER stand-in: a sampling function of ``name`` (k-diffusion's defaults) and options."""

    def function(model, x, sigmas, extra_args=None, callback=None, disable=None, eta=1.0, s_noise=1.0,
                 noise_sampler=None, r=0.5, solver_type="midpoint"):  # fmt: skip
        raise AssertionError("never called")

    function.__name__, function.__module__ = name, module
    return SimpleNamespace(sampler_function=function, extra_options=extra or {}, inpaint_options=inpaint or {})


@pytest.mark.parametrize(
    ("sampler", "expected"),
    [
        (comfy_sampler("sample_euler"), ("euler", {})),
        (comfy_sampler("sample_euler", inpaint={"random": True}), ("ddim", {})),
        (
            comfy_sampler("sample_euler_ancestral", extra={"eta": 0.5, "s_noise": 0.8}),
            ("euler_ancestral", {"eta": 0.5, "s_noise": 0.8}),
        ),  # noqa: E501
        (
            comfy_sampler("sample_dpmpp_2m_sde_gpu", extra={"eta": 0.7, "s_noise": 1.0, "solver_type": "heun"}),
            ("dpmpp_2m_sde_heun_gpu", {"eta": 0.7, "s_noise": 1.0}),
        ),  # noqa: E501
        (
            comfy_sampler("sample_dpmpp_sde", extra={"eta": 1.0, "s_noise": 1.1, "r": 0.5}),
            ("dpmpp_sde", {"eta": 1.0, "s_noise": 1.1}),
        ),  # noqa: E501
        (comfy_sampler("sample_unipc_bh2", module="comfy.extra_samplers.uni_pc"), ("uni_pc_bh2", {})),
        (comfy_sampler("dpm_fast_function", module="comfy.samplers"), ("dpm_fast", {})),
        (comfy_sampler("sample_dpm_fast", extra={"eta": 1.0}), ("dpm_fast", {})),  # eta at its default: dropped
    ],
)
def test_comfy_sampler_input_becomes_name_and_options(sampler, expected):
    assert sampler_from_input(sampler) == expected


@pytest.mark.parametrize(
    ("sampler", "match"),
    [
        (comfy_sampler("sample_euler_pp", module="comfy_extras.nodes_advanced_samplers"), "custom sampling"),
        (comfy_sampler("sample_dpmpp_sde", extra={"r": 0.7}), "r=0.7"),
        (comfy_sampler("sample_euler", extra={"solver_type": "heun"}), "solver_type"),
        (comfy_sampler("sample_lcm_upscale", extra={"total_upscale": 2.0}), "custom sampling"),
        (SimpleNamespace(), "SAMPLER"),
    ],
)
def test_comfy_sampler_input_that_cannot_run_is_explained(sampler, match):
    with pytest.raises(ConfigError, match=match) as err:
        sampler_from_input(sampler)
    assert "why:" in str(err.value) and "fix:" in str(err.value)


def test_host_checks_refuse_what_a_sampler_or_layout_cannot_do():
    check_sampling_args("euler_ancestral", "simple", 4, 1.0, eta=0.3, s_noise=0.9)
    check_sampling_args("er_sde", "kl_optimal", 2, 1.0, s_noise=0.5)
    check_sampling_args("uni_pc", "kl_optimal", 1, 1.0)  # uni_pc schedules one step more
    with pytest.raises(ConfigError, match="no eta"):
        check_sampling_args("er_sde", "simple", 4, 1.0, eta=0.5)
    with pytest.raises(ConfigError, match="s_noise"):
        check_sampling_args("seeds_2", "simple", 4, 1.0, s_noise=-1.0)
    with pytest.raises(ConfigError, match="kl_optimal"):
        check_sampling_args("euler", "kl_optimal", 1, 1.0)
    check_sampler_for_layout(ParallelConfig(pp=2), "uni_pc")
    check_sampler_for_layout(ParallelConfig(ulysses=2), "dpm_adaptive")
    with pytest.raises(ConfigError, match="dpm_adaptive sampler with PipeFusion"):
        check_sampler_for_layout(ParallelConfig(pp=2), "dpm_adaptive")
