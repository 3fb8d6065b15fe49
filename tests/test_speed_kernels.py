"""Choosing the fast kernels, on any machine: the attention registry by device capability (with the reason it
gives), the fallbacks, single-rank routing to a chosen kernel, and fp8 products (torch._scaled_mm runs on the
CPU too, so its numerics are checked here against the exact upcast path; tests/test_gpu_cuda.py checks the
CUDA kernels themselves on a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from parallel_runtime.attention import kernels, usp
from parallel_runtime.attention.kernels import (
    KERNELS,
    auto_order,
    describe_choice,
    manual_attention_lse,
    sdpa_attend_lse,
)
from parallel_runtime.attention.usp import SequenceParallelAttention
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.fp8 import Fp8Linear, quantise_per_tensor, set_scale
from parallel_runtime.models.fp8_matmul import apply_fp8_matmul, choose_fp8_matmul
from parallel_runtime.parallel.mesh import ParallelMesh

CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    ("capability", "order"),
    [((9, 0), ("flash3", "sdpa")), ((8, 9), ("flash", "sdpa")), ((8, 0), ("flash", "sdpa")), ((7, 5), ("sdpa",))],
)
def test_auto_order_follows_the_compute_capability(capability, order):
    assert auto_order(CUDA, capability)[0] == order
    assert auto_order(torch.device("cpu"))[0] == ("sdpa",)


def test_kernels_state_where_they_cannot_run():
    what, why, fix = KERNELS["flash3"].device_problem(CUDA, (8, 9))
    assert "9.0" in what and "8.9" in what and "'auto'" in fix
    assert "sm80" not in str(KERNELS["sage"].device_problem(CUDA, (9, 0)) or "")  # capability fine: at most a module
    assert "8.0" in KERNELS["sage"].device_problem(CUDA, (7, 5))[0]
    assert "cpu" in KERNELS["cudnn"].device_problem(torch.device("cpu"))[0]
    assert KERNELS["sdpa"].device_problem(CUDA, (7, 5)) is None
    assert not KERNELS["sage"].exact and all(KERNELS[n].exact for n in ("sdpa", "flash", "flash3", "cudnn"))


def test_kernels_state_which_inputs_they_refuse():
    assert "float32" in KERNELS["sage"].input_problem(torch.float32, 64, 64)[0]
    assert "256" in KERNELS["sage"].input_problem(torch.bfloat16, 256, 256)[0]
    assert KERNELS["sage"].input_problem(torch.bfloat16, 128, 128) is None
    assert KERNELS["cudnn"].input_problem(torch.bfloat16, 64, 32) is not None  # one head dim for q, k and v
    assert KERNELS["flash3"].input_problem(torch.bfloat16, 256, 256) is None


def test_the_choice_is_shown_with_its_reason():
    assert describe_choice("auto", torch.device("cpu")).startswith("sdpa (auto, torch SDPA on cpu")
    if kernels.try_import("flash_attn_interface")[0] is None:
        text = describe_choice("auto", CUDA, (9, 0))
        assert text.startswith("sdpa (auto, CUDA sm90") and "flash3 not available" in text
        assert "flash_attn_interface" in text
    assert describe_choice("sage", torch.device("cpu")).startswith("sage cannot run here")
    with pytest.raises(ConfigError):
        describe_choice("xformers", torch.device("cpu"))


def test_kernels_without_a_logsumexp_merge_ring_blocks_through_sdpa():
    q, k, v = (torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    expected = manual_attention_lse(q, k, v, 0.3)
    for got in (kernels._lse_or_sdpa(lambda *args: None)(q, k, v, 0.3), KERNELS["sage"].attend_lse(q, k, v, 0.3)):
        torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-5)
    assert KERNELS["sage"].attend_lse is sdpa_attend_lse


def test_one_rank_routes_plain_calls_to_the_chosen_kernel(monkeypatch):
    q, k, v = (torch.randn(1, 2, 6, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    attn = SequenceParallelAttention(ParallelMesh.single("cpu"), "auto")
    assert not attn.routes_sdpa  # plain SDPA at one rank: compiled blocks keep it in their graph
    assert torch.equal(attn(q, k, v), F.scaled_dot_product_attention(q, k, v))
    calls = []

    class Fake:
        name = "fake"

        @staticmethod
        def attend(q, k, v, scale):
            calls.append(scale)
            return torch.zeros_like(q)

    monkeypatch.setattr(usp, "select_kernel", lambda backend, q, v, usable: Fake)
    attn._single_kernel = "fake"  # what a CUDA device with flash-attn / FlashAttention 3 resolves to
    assert attn.routes_sdpa
    assert torch.equal(attn(q, k, v, scale=0.5), torch.zeros_like(q)) and calls == [0.5]
    mask = torch.ones(6, 6, dtype=torch.bool)
    torch.testing.assert_close(attn(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, mask))
    assert calls == [0.5]  # a masked call is not plain: torch's SDPA, with every argument


def test_fp8_products_are_chosen_by_device_and_dtype():
    bf16 = torch.bfloat16
    assert choose_fp8_matmul("auto", CUDA, bf16, (8, 9))[0] == "scaled_mm"
    assert choose_fp8_matmul("auto", CUDA, bf16, (9, 0))[0] == "scaled_mm"
    chosen, why = choose_fp8_matmul("auto", CUDA, bf16, (8, 6))
    assert chosen == "upcast" and "sm86" in why
    chosen, why = choose_fp8_matmul("auto", CUDA, torch.float32, (9, 0))
    assert chosen == "upcast" and "float32" in why
    chosen, why = choose_fp8_matmul("auto", torch.device("cpu"), bf16)
    assert chosen == "upcast" and "cpu" in why
    assert choose_fp8_matmul("upcast", CUDA, bf16, (9, 0))[0] == "upcast"
    with pytest.raises(ConfigError):
        choose_fp8_matmul("scaled_mm", CUDA, bf16, (8, 6))
    with pytest.raises(ConfigError):
        choose_fp8_matmul("fast", CUDA, bf16, (9, 0))


def _fp8_layer(inputs: int, outputs: int, seed: int = 0) -> tuple[Fp8Linear, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(outputs, inputs, generator=g) / inputs**0.5
    layer = Fp8Linear(inputs, outputs, bias=True, device="cpu")
    values, scale = quantise_per_tensor(weight)
    layer.weight = nn.Parameter(values, requires_grad=False)
    layer.bias = nn.Parameter(torch.randn(outputs, generator=g).to(torch.bfloat16), requires_grad=False)
    set_scale(layer, scale, torch.device("cpu"))
    return layer, torch.randn(2, 37, inputs, generator=g).to(torch.bfloat16)  # 74 rows: padded to 80


@pytest.mark.parametrize("rowwise", [True, False])
def test_fp8_product_is_close_to_the_exact_upcast_one(rowwise):
    layer, x = _fp8_layer(64, 48)
    exact = layer(x).float()
    layer.matmul, layer.rowwise = "scaled_mm", rowwise
    got = layer(x)
    assert got.shape == exact.shape and got.dtype == torch.bfloat16
    error = float((got.float() - exact).norm() / exact.norm())
    assert 0.0 < error < 0.06  # the input's own fp8 rounding (about 3%), nothing more
    layer.set_patched(layer.compute_weight(torch.float32) * 2)  # a LoRA-patched layer upcasts its patch
    torch.testing.assert_close(layer(x).float(), 2 * exact - layer.bias.float(), rtol=2e-2, atol=2e-2)


def test_apply_keeps_odd_sizes_upcasting():
    model = nn.Sequential(_fp8_layer(64, 48)[0], _fp8_layer(48, 40)[0], _fp8_layer(40, 24)[0])
    why = apply_fp8_matmul(model, "auto", CUDA, torch.bfloat16, capability=(9, 0))
    assert [m.matmul for m in model] == ["scaled_mm", "upcast", "upcast"]  # 40 is not a multiple of 16
    assert "2 layers of other sizes upcast" in why
    assert apply_fp8_matmul(nn.Sequential(nn.Linear(4, 4)), "auto", CUDA, torch.bfloat16, (9, 0)) == "no fp8 layers"
    apply_fp8_matmul(model, "auto", torch.device("cpu"), torch.bfloat16)
    assert {m.matmul for m in model} == {"upcast"}
