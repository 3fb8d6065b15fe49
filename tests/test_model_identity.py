"""Two loads of the same file with different settings are two models: neither changes the other's
pictures, and unloading or evicting one leaves the other usable (it reloads, the same model).

Oracle: each model's own first picture (same seed), and the fact that the two settings give
different pictures (fp8-stored weights round the fp32 ones)."""

from __future__ import annotations

import pytest
import torch

from parallel_runtime.runtime.pools import PoolRegistry
from parallel_runtime.service.api import load_parallel_model
from parallel_runtime.service.load_request import LoadRequest, model_key

PLAIN = LoadRequest("tiny-flux", "cpu:1", threads_per_worker=1)
FP8 = LoadRequest("tiny-flux", "cpu:1", threads_per_worker=1, storage="fp8_e4m3fn")


def _picture(model, cond) -> torch.Tensor:
    return model.sample(cond, None, None, 64, 64, seed=3, steps=2)


@pytest.fixture
def registry():
    registry = PoolRegistry(max_pools=2)
    yield registry
    registry.close_all()


def test_a_second_load_with_other_settings_leaves_the_first_model_alone(registry):
    plain = load_parallel_model(PLAIN, registry)
    cond = plain.encode_text("a red circle")
    first = _picture(plain, cond)
    fp8 = load_parallel_model(FP8, registry)
    assert fp8.pool is not plain.pool
    assert torch.equal(_picture(plain, cond), first)  # not the fp8 model's picture
    assert (_picture(fp8, cond) - first).abs().max() > 1e-3  # the two settings are two models

    fp8.unload()  # closes only the fp8 model's workers
    assert torch.equal(_picture(plain, cond), first)

    again = load_parallel_model(PLAIN, registry)  # the same settings: the same warm pool
    assert again.pool is plain.pool
    again.unload()  # closes the pool both handles use: the first reloads itself
    assert torch.equal(_picture(plain, cond), first) and not plain.pool.closed

    registry.max_pools = 1  # another model now evicts the plain model's pool
    evicted = plain.pool
    fp8 = load_parallel_model(FP8, registry)
    assert evicted.closed and not fp8.pool.closed
    assert torch.equal(_picture(plain, cond), first)


def test_the_key_holds_every_setting_that_changes_the_model(tmp_path):
    base = PLAIN.model_key("/m", 1)
    changed = [
        LoadRequest("tiny-flux", "cpu:1", dtype="bf16").model_key("/m", 1),
        FP8.model_key("/m", 1),
        LoadRequest("tiny-flux", "cpu:1", vae=str(tmp_path / "ae.safetensors")).model_key("/m", 1),
        LoadRequest("tiny-flux", "cpu:1", vae=str(tmp_path / "ae.safetensors"), vae_norm_groups=4).model_key("/m", 1),
        LoadRequest("tiny-flux", "cpu:2", pp_stage_weights=(1.0, 2.0)).model_key("/m", 2),
        PLAIN.model_key("/other", 1),
        LoadRequest("tiny-flux", "cpu:1", dequant_dtype="bfloat16").model_key("/m", 1),
    ]
    assert len({base, *changed}) == len(changed) + 1
    # Stage weights split nothing without PipeFusion stages: the same model.
    assert LoadRequest("tiny-flux", "cpu:1", pp_stage_weights=(1.0,)).model_key("/m", 1) == base
    # The worker keeps its loaded model by the same key the host keys its pools by.
    assert FP8.model_key("/m", 1) == model_key("/m", "fp32", 1, storage="fp8_e4m3fn")
