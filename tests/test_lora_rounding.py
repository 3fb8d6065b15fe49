"""Patched fp8 weights are stored with seeded stochastic rounding (as ComfyUI stores them): values on
the fp8 grid stay exact, others go to a neighbour with the probability that makes them unbiased."""

from __future__ import annotations

import pytest
import torch

from parallel_runtime.models.lora.rounding import rounding_for, stochastic_round

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FP8)
def test_values_on_the_grid_are_kept_exactly(dtype):
    grid = torch.linspace(-200, 200, 4001).to(dtype).float()  # every value representable
    assert torch.equal(stochastic_round(grid, dtype, seed=3).float(), grid)


@pytest.mark.parametrize("dtype", FP8)
def test_other_values_go_to_a_neighbour_unbiased_and_reproducibly(dtype):
    x = torch.tensor([0.3, -1.37, 5.1, 0.011, 100.7])
    lo = x.to(dtype).float()  # round to nearest: one neighbour
    draws = torch.stack([stochastic_round(x, dtype, seed=s).float() for s in range(4000)])
    for j in range(x.numel()):
        values = set(draws[:, j].tolist())
        assert len(values) == 2 and lo[j].item() in values, (x[j], values)  # the two neighbours only
    assert torch.allclose(draws.mean(0), x, rtol=0.02)  # unbiased: plain rounding would keep the bias
    fn = rounding_for("transformer.blocks.0.weight")
    assert torch.equal(fn(x, dtype).float(), fn(x, dtype).float())  # one seed per tensor name


def test_small_updates_survive_on_average_where_round_to_nearest_drops_them():
    w = torch.full((20000,), 1.0)
    patched = w + 0.01  # far below e4m3's spacing at 1.0 (0.125)
    assert torch.equal(patched.to(torch.float8_e4m3fn).float(), w)  # round to nearest loses the patch
    stored = stochastic_round(patched, torch.float8_e4m3fn, seed=1).float()
    assert abs(stored.mean().item() - 1.01) < 0.003
