"""Sequence-parallel attention: Ulysses, Ring and USP on real gloo worker processes, compared with
single-device F.scaled_dot_product_attention; kernels, LSE merge and errors in-process."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from parallel_runtime.attention import kernels as attention_kernels
from parallel_runtime.attention.kernels import KERNELS, manual_attention_lse, sdpa_attend_lse, select_kernel
from parallel_runtime.attention.ring import merge_partial
from parallel_runtime.attention.usp import ATTENTION_BACKENDS, SequenceLayout, SequenceParallelAttention, check_backend
from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from tests.dist_jobs import attention_jobs

TIMEOUT = 120

LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ring2": ParallelConfig(ring=2),
    "usp2x2": ParallelConfig(ring=2, ulysses=2),
    "ulysses4": ParallelConfig(ulysses=4),
}


def _qkv(b: int, h: int, s: int, d: int, seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g).to(dtype) for _ in range(3)]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


# -- distributed (one warm pool per layout; the module-scoped param groups tests by layout) -------
@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, cpu_pool):
    config = LAYOUTS[request.param]
    return config, cpu_pool(config)


def _run(pool, job, *args, **kwargs):
    return pool.submit(job, *args, result_rank="all", **kwargs).result(timeout=TIMEOUT)


@pytest.mark.parametrize("seq", [16, 37, 3])
def test_matches_single_device(layout, seq):
    """Even and uneven token splits (37 over 2 and 4 ranks; 3 tokens over 4 leaves one rank empty)."""
    config, pool = layout
    q, k, v = _qkv(2, 4, seq, 8, seed=seq)
    outs = _run(pool, attention_jobs.run_usp, q, k, v, backend="sdpa")
    got = torch.cat([o for o, _ in outs], dim=2)
    assert got.shape == q.shape
    assert _max_diff(got, F.scaled_dot_product_attention(q, k, v)) <= 1e-5


def test_heads_not_divisible(layout):
    """3 heads over 2 (or 4) ulysses ranks: heads split unevenly (a rank may hold none)."""
    _, pool = layout
    q, k, v = _qkv(1, 3, 37, 8, seed=3)
    outs = _run(pool, attention_jobs.run_usp, q, k, v)
    got = torch.cat([o for o, _ in outs], dim=2)
    assert _max_diff(got, F.scaled_dot_product_attention(q, k, v)) <= 1e-5


def test_grouped_query_heads(layout):
    """enable_gqa: 4 query heads share 2 K/V heads."""
    _, pool = layout
    q, k, v = _qkv(1, 4, 19, 8, seed=4)
    k, v = k[:, :2], v[:, :2]
    outs = _run(pool, attention_jobs.run_usp, q, k, v, enable_gqa=True)
    got = torch.cat([o for o, _ in outs], dim=2)
    assert _max_diff(got, F.scaled_dot_product_attention(q, k, v, enable_gqa=True)) <= 1e-5


def test_scale_through_intercept(layout):
    """``scale`` is respected, and F.scaled_dot_product_attention inside intercept() is routed."""
    _, pool = layout
    q, k, v = _qkv(1, 4, 21, 8, seed=5)
    outs = _run(pool, attention_jobs.run_usp, q, k, v, scale=0.3, via_intercept=True)
    got = torch.cat([o for o, _ in outs], dim=2)
    assert _max_diff(got, F.scaled_dot_product_attention(q, k, v, scale=0.3)) <= 1e-5
    assert all(sent.get("ulysses", 0) + sent.get("ring", 0) > 0 for _, sent in outs)  # really parallel


def test_joint_text_image(layout):
    """Local sequence = [text shard, image shard]: equals full joint attention up to that permutation."""
    _, pool = layout
    tq, tk, tv = _qkv(1, 4, 7, 8, seed=7)
    iq, ik, iv = _qkv(1, 4, 30, 8, seed=8)
    outs = _run(pool, attention_jobs.run_joint, tq, tk, tv, iq, ik, iv)
    full = [torch.cat(p, dim=2) for p in ((tq, iq), (tk, ik), (tv, iv))]
    ref = F.scaled_dot_product_attention(*full)
    got = torch.cat([o for o, _ in outs], dim=2)
    index = torch.cat([i for _, i in outs])
    assert sorted(index.tolist()) == list(range(37))
    assert _max_diff(got, ref[:, :, index]) <= 1e-5


def test_bf16_smoke(layout):
    _, pool = layout
    q, k, v = _qkv(1, 4, 37, 16, seed=11, dtype=torch.bfloat16)
    outs = _run(pool, attention_jobs.run_usp, q, k, v)
    got = torch.cat([o for o, _ in outs], dim=2)
    assert got.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert _max_diff(got, ref) <= 1e-2  # bf16 rounding; single-device bf16 SDPA is ~3e-3 off


def test_byte_counts_match_formulas(layout):
    """Even split, two calls on one object: Ulysses and Ring bytes twice the per-layer formula,
    the token-count exchange ("meta") once."""
    config, pool = layout
    b, heads, seq, d = 2, 4, 16, 8
    q, k, v = _qkv(b, heads, seq, d, seed=13)
    outs = _run(pool, attention_jobs.run_usp, q, k, v, calls=2)
    e, hidden, n_uly, n_ring = 4, heads * d, config.ulysses, config.ring
    # Per rank and layer: Ulysses 4·e·B·S·h·(N−1)/N² over the ring block's S/R tokens;
    # Ring 2·e·B·S·h·(N−1)/N over the h/U hidden units left after Ulysses.
    uly = 4 * e * b * (seq // n_ring) * hidden * (n_uly - 1) / n_uly**2
    ring = 2 * e * b * seq * (hidden // n_uly) * (n_ring - 1) / n_ring
    expected = {"ulysses": 2 * uly, "ring": 2 * ring, "meta": 8 * (config.sp_degree - 1)}
    expected = {op: int(n) for op, n in expected.items() if n}
    for rank, (_, sent) in enumerate(outs):
        assert sent == expected, f"rank {rank}"


def test_mask_and_cross_attention_rejected(layout):
    _, pool = layout
    q, k, v = _qkv(1, 4, 16, 8)
    hides = torch.ones(16, 16, dtype=torch.bool)
    hides[3, 5] = False  # a mask that hides nothing is no mask (hiding_mask); one that hides a key is refused
    msgs = _run(pool, attention_jobs.run_rejected, q, k, v, attn_mask=hides)
    assert all("attn_mask" in m and "fix:" in m for m in msgs), msgs
    msgs = _run(pool, attention_jobs.run_rejected, q, k, v, is_causal=True)
    assert all("is_causal" in m for m in msgs), msgs
    msgs = _run(pool, attention_jobs.run_rejected, q, k, v, dropout_p=0.1)
    assert all("dropout_p" in m for m in msgs), msgs


# -- in-process: single rank, kernels, merge, errors ----------------------------------------------
def test_a_mask_that_hides_nothing_is_no_mask():
    from parallel_runtime.attention.usp import hiding_mask

    assert hiding_mask(None) is None
    assert hiding_mask(torch.ones(2, 1, 4, 4, dtype=torch.bool)) is None
    assert hiding_mask(torch.zeros(4, 4)) is None  # additive
    some = torch.ones(4, 4, dtype=torch.bool)
    some[0, 1] = False
    assert hiding_mask(some) is some
    bias = torch.zeros(4, 4)
    bias[1, 2] = float("-inf")
    assert hiding_mask(bias) is bias


def test_single_rank_bit_identical_to_sdpa():
    attn = SequenceParallelAttention(ParallelMesh.single("cpu"))
    q, k, v = _qkv(2, 4, 13, 8, seed=1)
    mask = torch.rand(13, 13, generator=torch.Generator().manual_seed(2)) > 0.3
    for kwargs in ({}, {"scale": 0.2}, {"attn_mask": mask}, {"is_causal": True}):
        assert torch.equal(attn(q, k, v, **kwargs), F.scaled_dot_product_attention(q, k, v, **kwargs)), kwargs
    kg, vg = k[:, :2], v[:, :2]
    assert torch.equal(attn(q, kg, vg, enable_gqa=True), F.scaled_dot_product_attention(q, kg, vg, enable_gqa=True))


def test_intercept_routes_sdpa_single_rank():
    calls = []

    class Spy(SequenceParallelAttention):
        def __call__(self, *args, **kwargs):
            calls.append(kwargs)
            return super().__call__(*args, **kwargs)

    attn = Spy(ParallelMesh.single("cpu"))
    q, k, v = _qkv(1, 2, 5, 4)
    with attn.intercept():
        out = F.scaled_dot_product_attention(q, k, v, scale=0.5)
        other = torch.matmul(q, k.transpose(-1, -2))  # other torch functions are untouched
    assert calls == [{"scale": 0.5}]
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, scale=0.5))
    assert other.shape == (1, 2, 5, 5)
    F.scaled_dot_product_attention(q, k, v)
    assert len(calls) == 1  # scope ended


def test_unknown_backend_lists_valid_choices():
    assert ATTENTION_BACKENDS == ("auto", "sdpa", "flash", "flash3", "sage", "cudnn")
    with pytest.raises(ConfigError) as info:
        SequenceParallelAttention(ParallelMesh.single("cpu"), "xformers")
    msg = str(info.value)
    assert "'xformers'" in msg and "why:" in msg
    assert "auto, sdpa, flash, flash3, sage, cudnn" in msg


def test_flash_on_cpu_says_why_and_how_to_fix():
    with pytest.raises(ConfigError) as info:
        SequenceParallelAttention(ParallelMesh.single("cpu"), "flash")
    msg = str(info.value)
    assert "cpu" in msg and "cuda" in msg and "'sdpa'" in msg


def test_flash_not_installed_says_how_to_install():
    if attention_kernels.try_import("flash_attn")[0] is not None:
        pytest.skip("flash_attn is installed here")
    with pytest.raises(ConfigError) as info:
        check_backend("flash", "cuda")  # only the import is checked, no GPU needed
    msg = str(info.value)
    assert "pip install flash-attn" in msg and "dit-parallel[gpu]" in msg


def test_flash_rejects_float32_inputs():
    what, why, fix = KERNELS["flash"].input_problem(torch.float32, 64, 64)
    assert "float32" in what and "bfloat16" in why and "'sdpa'" in fix
    assert KERNELS["flash"].input_problem(torch.bfloat16, 64, 64) is None
    assert KERNELS["flash"].input_problem(torch.bfloat16, 512, 512) is not None


def test_auto_on_cpu_selects_sdpa():
    q, _, v = _qkv(1, 2, 4, 8)
    assert select_kernel("auto", q, v, attention_kernels.usable_backends(q.device)).name == "sdpa"
    assert check_backend("auto", "cpu") == "auto"


def _formula_attention(q, k, v, scale):
    """softmax(q kᵀ·scale) v and logsumexp, written out in float64."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    denom = p.sum(-1, keepdim=True)
    return (p / denom) @ v.double(), (m + torch.log(denom)).squeeze(-1)


def test_lse_merge_matches_formula():
    q, k, v = _qkv(2, 3, 6, 4, seed=21)
    k, v = k.repeat(1, 1, 2, 1) * 3, v.repeat(1, 1, 2, 1)  # 12 keys, large scores to test stability
    scale = 0.7
    full_out, full_lse = _formula_attention(q, k, v, scale)
    for bounds in ([0, 5, 12], [0, 1, 2, 7, 12], [0, 12]):
        out = lse = None
        for lo, hi in zip(bounds, bounds[1:]):
            bo, bl = _formula_attention(q, k[:, :, lo:hi], v[:, :, lo:hi], scale)
            out, lse = merge_partial(out, lse, bo.float(), bl.float())
        assert out.dtype == torch.float32
        assert (out.double() - full_out).abs().max() <= 1e-5
        assert (lse.double() - full_lse).abs().max() <= 1e-5


def test_lse_merge_ignores_empty_block():
    q, k, v = _qkv(1, 2, 3, 4, seed=22)
    out, lse = _formula_attention(q, k, v, 0.5)
    empty_out = torch.zeros_like(out.float())
    empty_lse = torch.full_like(lse.float(), float("-inf"))
    m_out, m_lse = merge_partial(empty_out, empty_lse, out.float(), lse.float())
    assert torch.allclose(m_out.double(), out, atol=1e-6) and torch.allclose(m_lse.double(), lse, atol=1e-6)
    m_out, m_lse = merge_partial(out.float(), lse.float(), empty_out, empty_lse)
    assert torch.allclose(m_out.double(), out, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_sdpa_lse_kernel_matches_formula(dtype):
    q, k, v = _qkv(2, 3, 9, 8, seed=23, dtype=dtype)
    k5, v5 = k[:, :, :5], v[:, :, :5]
    ref_out, ref_lse = _formula_attention(q, k5, v5, 0.4)
    tol, lse_tol = (2e-2, 1e-2) if dtype == torch.bfloat16 else (1e-5, 1e-4)
    for fn in (sdpa_attend_lse, manual_attention_lse):
        out, lse = fn(q, k5, v5, 0.4)
        assert out.dtype == dtype and lse.shape == (2, 3, 9)
        assert (out.double() - ref_out).abs().max() <= tol, fn.__name__
        assert (lse.double() - ref_lse).abs().max() <= lse_tol, fn.__name__


def test_sdpa_lse_kernel_value_head_dim_differs():
    """The fused CPU op needs one head dim; the kernel then falls back to the manual path."""
    q, k, _ = _qkv(1, 2, 5, 8, seed=24)
    v = torch.randn(1, 2, 5, 4)
    out, lse = sdpa_attend_lse(q, k, v, None)
    ref_out, ref_lse = _formula_attention(q, k, v, 1 / math.sqrt(8))
    assert out.shape == (1, 2, 5, 4)
    assert (out.double() - ref_out).abs().max() <= 1e-5 and (lse.double() - ref_lse).abs().max() <= 1e-5


def test_kernels_survive_empty_inputs():
    """Torch's fused CPU kernel crashes the process on zero queries or keys; ours return cleanly."""
    q, k, v = _qkv(1, 2, 4, 8)
    out, lse = sdpa_attend_lse(q[:, :, :0], k, v)
    assert out.shape == (1, 2, 0, 8) and lse.shape == (1, 2, 0)
    out, lse = sdpa_attend_lse(q, k[:, :, :0], v[:, :, :0])
    assert torch.equal(out, torch.zeros_like(q)) and torch.isinf(lse).all()
    assert attention_kernels.sdpa_attend(q[:, :0], k[:, :0], v[:, :0]).shape == (1, 0, 4, 8)


def test_manual_kernel_chunks_queries(monkeypatch):
    q, k, v = _qkv(1, 2, 11, 8, seed=25)
    whole = manual_attention_lse(q, k, v, 0.3)
    monkeypatch.setattr(attention_kernels, "_MANUAL_CHUNK_ELEMENTS", 2 * 11 * 3)  # 3 query rows per chunk
    chunked = manual_attention_lse(q, k, v, 0.3)
    assert torch.allclose(whole[0], chunked[0], atol=1e-6) and torch.allclose(whole[1], chunked[1], atol=1e-6)


def test_sequence_layout_from_gathered_lengths():
    # ring 2 x ulysses 2, 37 tokens split over 4 sp ranks: [10, 9, 9, 9]
    layout = SequenceLayout.from_sp_lens([10, 9, 9, 9], ulysses=2, ring_rank=1)
    assert layout.ulysses_lens == (9, 9) and layout.ring_lens == (19, 18)
    assert SequenceLayout.from_sp_lens([10, 9, 9, 9], ulysses=2, ring_rank=0).ulysses_lens == (10, 9)
