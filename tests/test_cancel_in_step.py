"""Cancel takes effect inside a denoising step, at a transformer block boundary, on every rank together
(runtime/cancel_points.py): a step of a big model at a big size lasts minutes, so waiting for its end is
not a cancel. Blocks are slowed (tests/dist_jobs/runtime_jobs.slow_blocks) so that one step of tiny-flux
(4 blocks) lasts 4 x BLOCK_S; the cancel comes early in the first step."""

from __future__ import annotations

import time

import pytest

from parallel_runtime.denoise.caching.specs import BlockCacheSpec
from parallel_runtime.errors import JobCancelled
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.builtin_jobs import echo
from parallel_runtime.runtime.pools import PoolRegistry
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from tests.dist_jobs.runtime_jobs import slow_blocks

BLOCK_S = 0.6
BLOCKS = 4  # tiny-flux: 2 double + 2 single blocks


class _SlowRegistry(PoolRegistry):
    def get(self, devices, config, key=None, **options):
        return super().get(devices, config, key, worker_setup=(slow_blocks, (BLOCK_S,)), **options)


@pytest.fixture(scope="module")
def registry():
    """One slowed pool per layout, shared by its plain and block-cache cases (each case checks that the
    cancel left the pool warm; the next case then starts from a pool that has seen a cancel)."""
    registry = _SlowRegistry()
    yield registry
    registry.close_all()


@pytest.mark.parametrize("cache", [None, BlockCacheSpec(threshold=0.2)], ids=["plain", "block-cache"])
@pytest.mark.parametrize("layout", [ParallelConfig(ulysses=2), ParallelConfig(cfg=2)], ids=["ulysses2", "cfg2"])
def test_a_cancel_lands_at_the_next_block_boundary_on_every_rank(registry, layout, cache):
    """With or without a block cache (which runs the blocks itself, in parts around its decision)."""
    model = load_parallel_model(LoadRequest("tiny-flux", "cpu:2", layout, threads_per_worker=1), registry)
    model = model if cache is None else model.with_cache(cache)
    cond = model.encode_text("a red circle")
    pids = model.pool.pids
    events: list[tuple[float, str, object]] = []
    cancel_at: list[float] = []

    def should_cancel() -> bool:
        if not cancel_at and time.monotonic() - started > 0.3:
            cancel_at.append(time.monotonic())
        return bool(cancel_at)

    started = time.monotonic()
    with pytest.raises(JobCancelled):
        model.sample(
            cond,
            cond,
            None,
            64,
            64,
            steps=3,
            cfg=2.0,
            should_cancel=should_cancel,
            on_event=lambda rank, kind, payload: events.append((time.monotonic(), kind, payload)),
        )
    ended = time.monotonic()
    step_s = BLOCKS * BLOCK_S
    # the first step (>= 2.4 s) never finished: the job ended at a block boundary inside it
    assert not [e for e in events if e[1] == "progress"], events
    assert ended - cancel_at[0] < 2 * BLOCK_S + 0.5 < step_s  # one block, the agreement, the round trip
    assert model.pool.pids == pids and model.pool.submit(echo, 7).result(30) == 7  # every rank stopped together
