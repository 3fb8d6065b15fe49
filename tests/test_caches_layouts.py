"""Every cache on every layout, on the trained tiny-flux-shapes (real decisions, real CPU worker pools).

Oracles: the single-rank run with the same cache (Ulysses 2, Ring 2, CFG 2: the same decisions on every rank
and the same latent to 1e-5; PipeFusion with every step synchronous: the same), the uncached run (a cache
that can never reuse changes nothing; the quality floor), and the ranks themselves (a rank whose local
measure differs still takes the group's decision).
"""

from __future__ import annotations

import functools

import pytest
import torch

from parallel_runtime.denoise.caching.specs import BlockCacheSpec, StepCacheSpec
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.builtin import builtin_model_path
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.models.text_encoding import encode_prompts
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.load_job import load_model
from tests.dist_jobs.cache_jobs import skewed_decisions

MODEL, PX, STEPS, CFG, SEED = "tiny-flux-shapes", 128, 10, 2.0, 1
PROMPT = "a red circle on a blue background"
CACHES = {
    "easycache": StepCacheSpec("easycache"),  # reuses 4 of the 10 steps on one rank
    "lazycache": StepCacheSpec("lazycache"),  # 5
    "block": BlockCacheSpec(threshold=0.35),  # 4 (at 0.2, none: 10 steps change too much per step)
}
# PipeFusion's streaming block cache decides per patch: at the block threshold above it reuses so much that
# the picture leaves the bound, and at 10 steps of 0.2 it reuses once: 20 steps of 0.2 reuse >= 3 within it.
STREAM_STEPS, STREAM_BLOCK = 20, BlockCacheSpec(threshold=0.2)
# CFG 2 first: the one-rank and CFG 2 pools of the two tests before it are still warm (3 pools are kept).
LAYOUTS = {"cfg2": ParallelConfig(cfg=2), "ulysses2": ParallelConfig(ulysses=2), "ring2": ParallelConfig(ring=2)}


@functools.cache
def prompts() -> tuple:
    comps = load_pipeline_components(builtin_model_path(MODEL), "cpu", torch.float32)
    return encode_prompts(comps, "flux", PROMPT, "")


def run(
    registry, config: ParallelConfig, cache=None, steps: int = STEPS, conds: tuple | None = None, **request
) -> tuple[torch.Tensor, dict]:
    """(latent, every rank's cache summaries) of one sample on a pool of ``config`` (``conds``: (pos, neg))."""
    model = load_parallel_model(
        LoadRequest(MODEL, devices=f"cpu:{config.world_size}", layout=config, **request), registry
    )
    if cache is not None:
        model = model.with_cache(cache)
    events: list = []
    pos, neg = conds or prompts()
    out = model.sample(
        pos,
        neg,
        None,
        PX,
        PX,
        seed=SEED,
        steps=steps,
        cfg=CFG,
        on_event=lambda rank, kind, payload: events.append((rank, kind, payload)),
    )
    return out, {rank: payload for rank, kind, payload in events if kind == "cache"}


def trace(summaries: list[dict]) -> object:
    (summary,) = summaries
    return summary["trace"]


def reuses(summaries: list[dict]) -> int:
    (summary,) = summaries
    return summary.get("skipped", summary.get("reused"))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@functools.cache
def one_rank(registry, cache: str) -> tuple[torch.Tensor, dict]:
    return run(registry, ParallelConfig(), CACHES[cache])


def test_cfg_parallel_block_cache_with_branches_in_separate_calls_equals_one_rank(pool_registry):
    """A negative of another text length runs in its own model call (as ComfyUI batches), so under CFG
    parallel each rank sits out the other branch's call: it still joins that call's cache decision, and the
    block-boundary cancel points (collective over both ranks) are agreed at the step's end there instead. The
    job must finish (no rank waiting alone in a collective) and equal one rank with the same cache."""
    pos, neg = prompts()
    neg = neg.with_tensors({**neg.tensors(), "prompt_embeds": neg.prompt_embeds[:, :77]})  # a shorter negative
    expected, reference = run(pool_registry, ParallelConfig(), CACHES["block"], conds=(pos, neg))
    out, reports = run(pool_registry, LAYOUTS["cfg2"], CACHES["block"], conds=(pos, neg))
    assert sorted(reports) == [0, 1]
    assert len(trace(reference[0])) == 2  # two calls per evaluation: the branches were not batched
    assert reuses(reference[0]) >= 3, "the cache must reuse for this test to mean anything"
    for rank, summaries in reports.items():
        assert trace(summaries) == trace(reference[0]), rank
    assert relative(out, expected) <= 1e-5


def test_a_cache_that_never_reuses_changes_nothing(pool_registry):
    plain, reports = run(pool_registry, ParallelConfig())
    assert reports == {}  # no cache: the plain denoiser, no cache report
    for spec in CACHES.values():
        never = StepCacheSpec(spec.kind, 0.0) if isinstance(spec, StepCacheSpec) else BlockCacheSpec(threshold=0.0)
        out, reports = run(pool_registry, ParallelConfig(), never)
        assert reuses(reports[0]) == 0
        assert relative(out, plain) <= 1e-6, spec


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_with_cache_equals_one_rank_with_cache(pool_registry, layout):
    """Each cache on ``layout`` against one rank with the same cache (one pool for the three caches)."""
    for cache in CACHES:
        expected, reference = one_rank(pool_registry, cache)
        assert reuses(reference[0]) >= 3, "the cache must reuse for this test to mean anything"
        out, reports = run(pool_registry, LAYOUTS[layout], CACHES[cache])
        assert sorted(reports) == [0, 1]
        for rank, summaries in reports.items():
            assert trace(summaries) == trace(reference[0]), (cache, layout, rank)
        assert relative(out, expected) <= 1e-5, (cache, layout)


def test_pipefusion_block_cache_every_step_synchronous_equals_one_rank(pool_registry):
    """With warmup = steps every PipeFusion item is a whole model call: the same decisions as one rank."""
    expected, reference = one_rank(pool_registry, "block")
    out, reports = run(pool_registry, ParallelConfig(pp=2), CACHES["block"], pp_warmup=STEPS)
    expected_trace = list(trace(reference[0]).values())  # one stream of calls / one band: the whole image
    for rank, summaries in reports.items():
        assert list(trace(summaries).values()) == expected_trace, rank
    assert relative(out, expected) <= 1e-5


def test_pipefusion_block_cache_streaming_decides_per_patch_on_every_rank(pool_registry):
    plain, _ = run(pool_registry, ParallelConfig(pp=2), steps=STREAM_STEPS)
    out, reports = run(pool_registry, ParallelConfig(pp=2), STREAM_BLOCK, steps=STREAM_STEPS)
    assert sorted(reports) == [0, 1]
    assert trace(reports[0]) == trace(reports[1])  # the second stage followed the first one's decisions
    assert reports[0][0]["reused"] >= 3
    mse = float((out - plain).pow(2).mean())
    assert 0.0 < mse <= 1e-3 * float(plain.pow(2).mean())  # close to PipeFusion without the cache


def test_step_cache_under_pipefusion_is_refused_before_any_worker_runs(pool_registry):
    with pytest.raises(ConfigError) as err:
        run(pool_registry, ParallelConfig(pp=2), CACHES["easycache"])
    assert "PipeFusion" in str(err.value) and "Block Cache" in str(err.value)


@pytest.mark.parametrize("cache", ["block", "lazycache"])
def test_a_rank_whose_local_measure_differs_still_takes_the_group_decision(cpu_pool, cache):
    """Rank 1 adds three times its share of the change: its local measure differs from rank 0's, a decision
    taken from each rank's own measure would differ, and yet both ranks take the same decisions."""
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(builtin_model_path(MODEL)), "fp32", "sdpa").result(300)
    from parallel_runtime.denoise.settings import SamplingSettings

    spec = CACHES[cache]
    kwargs = {"block_cache": spec} if isinstance(spec, BlockCacheSpec) else {"step_cache": spec}
    settings = SamplingSettings(seed=SEED, steps=STEPS, cfg=CFG, **kwargs)
    pos, neg = prompts()
    results = pool.submit(
        skewed_decisions, pos, neg, torch.zeros(1, 16, PX // 8, PX // 8), settings, result_rank="all"
    ).result(600)
    r0, r1 = results
    assert trace(r0["reports"]) == trace(r1["reports"])  # the same decisions
    assert r0["totals"] == r1["totals"]  # from the same global sums
    # ... although the ranks' own parts of the change differ (rank 1's is skewed) ...
    assert any(abs(a[0] - b[0]) > 0.5 * max(abs(a[0]), abs(b[0])) for a, b in zip(r0["parts"], r1["parts"]))
    if cache == "block":  # ... so deciding from its own parts, each rank would have decided differently
        local = [[p[0] / p[1] < spec.threshold for p in r["parts"] if p[1]] for r in results]
        assert local[0] != local[1]
