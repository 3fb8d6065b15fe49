"""Host-side value checks: types, ComfyUI's bounds on work, finite numbers (pure functions)."""

from __future__ import annotations

import math

import pytest
import torch

from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.service import input_checks as checks

GOOD = dict(width=64, height=64, batch_size=1, seed=0, steps=20, cfg=1.0, denoise=1.0)


def _rejects(needle: str, **changes):
    with pytest.raises(ConfigError) as info:
        checks.sampling_values(**{**GOOD, **changes})
    message = str(info.value)
    assert needle in message and "why:" in message and "fix:" in message, message
    return message


def test_comfyui_limits_pass_and_normalise():
    out = checks.sampling_values(**{**GOOD, "steps": 10_000, "seed": 2**64 - 1, "width": 16_384, "denoise": 0.01})
    assert out["steps"] == 10_000 and out["seed"] == 2**64 - 1 and out["denoise"] == 0.01
    assert checks.sampling_values(**{**GOOD, "steps": 8.0, "cfg": 3})["steps"] == 8  # integral float, int cfg


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"steps": 10_000_000}, "steps=10000000 is out of range"),
        ({"steps": 0}, "steps=0 is out of range"),
        ({"steps": "3"}, "steps='3' is not a whole number"),
        ({"steps": True}, "steps=True is not a whole number"),
        ({"steps": 2.5}, "steps=2.5 is not a whole number"),
        ({"denoise": 1e-9}, "schedule of 2e+10 sigmas"),
        ({"width": 1 << 20}, "width=1048576 is out of range"),
        ({"batch_size": 0}, "batch_size=0 is out of range"),
        ({"seed": -1}, "seed=-1 is out of range"),
        ({"seed": 2**64}, "is out of range"),
        ({"cfg": math.nan}, "cfg is nan"),
        ({"cfg": math.inf}, "cfg is inf"),
        ({"guidance": -math.inf}, "guidance is -inf"),
        ({"denoise": math.nan}, "denoise is nan"),
        ({"cfg": "7"}, "cfg='7' is not a number"),
    ],
)
def test_bad_values_are_named(changes, needle):
    _rejects(needle, **changes)


def test_non_finite_tensors_are_named():
    _rejects("LATENT holds 1 NaN", latent=torch.tensor([[[[0.0, math.nan]]]]))
    _rejects("SIGMAS input holds 1 NaN", sigmas=torch.tensor([1.0, math.nan, 0.0]))
    _rejects("SIGMAS input has 10002 values", sigmas=torch.linspace(1, 0, 10_002))
    cond = Conditioning(torch.tensor([[[1.0, math.inf]]]))
    with pytest.raises(ConfigError, match="positive conditioning's embeddings holds 1 NaN/infinite"):
        checks.conditioning("positive", cond, required=True)


def test_conditioning_and_prompts_are_required():
    with pytest.raises(ConfigError, match="no positive conditioning was given"):
        checks.conditioning("positive", None, required=True)
    checks.conditioning("negative", None, required=False)
    with pytest.raises(ConfigError, match="is a dict, not a Conditioning"):
        checks.conditioning("positive", {}, required=True)
    with pytest.raises(ConfigError, match="no prompt to encode"):
        checks.prompts([])
    with pytest.raises(ConfigError, match="prompts must be strings, got int"):
        checks.prompts(["a", 3])
    assert checks.prompts("a fox") == ["a fox"]


def test_decode_latent_shape_channels_and_values():
    with pytest.raises(ConfigError, match="cannot decode a LATENT of shape"):
        checks.decode_latent(torch.zeros(1, 16, 0, 8), 16)
    with pytest.raises(ConfigError, match="has 4 channels but this model's VAE decodes 16"):
        checks.decode_latent(torch.zeros(1, 4, 8, 8), 16)
    with pytest.raises(ConfigError, match="LATENT holds 64 NaN"):
        checks.decode_latent(torch.full((1, 16, 2, 2), math.nan), 16)


def test_an_unknown_sampler_or_scheduler_is_explained_truthfully():
    """The why says what is true: the name is none of ComfyUI's KSampler names, all of which the Parallel
    Sampler runs (the sampling tables hold every one of them)."""
    from parallel_runtime.sampling import SAMPLER_NAMES, SCHEDULER_NAMES
    from parallel_runtime.service.sampling_checks import check_sampling_args

    with pytest.raises(ConfigError) as info:
        check_sampling_args("euler_typo", "simple", 10, 1.0)
    message = str(info.value)
    assert "runs the samplers of ComfyUI 0.3.64's KSampler" in message and "none of them" in message
    assert all(name in message for name in SAMPLER_NAMES)
    with pytest.raises(ConfigError) as info:
        check_sampling_args("euler", "karras_typo", 10, 1.0)
    assert "builds the schedules of ComfyUI 0.3.64's KSampler" in str(info.value)
    assert all(name in str(info.value) for name in SCHEDULER_NAMES)
