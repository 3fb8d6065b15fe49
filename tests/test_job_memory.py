"""A sampling job's activation memory is estimated on the host from the plan (tokens, width, layout,
dtype; service/memory_checks.py) and a job that cannot fit the devices' free memory is refused before
anything is sent, instead of growing the workers until the OOM killer ends them.

Oracle for the estimate: the peak of the bytes torch allocates in a CPU worker during one step
(measured here from the profiler's memory records). One pool per layout for the file (a loaded model is reused:
the measure counts only what a step allocates)."""

from __future__ import annotations

import math
import time

import pytest

from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.pools import PoolRegistry
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.memory_checks import available_ram, sampling_bytes_per_rank
from tests.dist_jobs.runtime_jobs import step_memory_growth

SIDE = 2048  # px: 16,384 image tokens of tiny-flux, ~0.1 GiB a rank


@pytest.fixture(scope="module")
def loaded():
    """``loaded(layout)`` -> tiny-flux loaded on ``layout``'s CPU ranks (one thread each), one model per layout."""
    registry = PoolRegistry()
    models = {}

    def get(layout: ParallelConfig):
        if layout not in models:
            request = LoadRequest("tiny-flux", f"cpu:{layout.world_size}", layout, threads_per_worker=1)
            models[layout] = load_parallel_model(request, registry)
        return models[layout]

    try:
        yield get
    finally:
        registry.close_all()


@pytest.mark.parametrize(
    "layout, cfg",
    [(ParallelConfig(), 1.0), (ParallelConfig(ulysses=2), 1.0), (ParallelConfig(), 2.0)],
    ids=["1rank", "ulysses2", "batched-cfg"],
)
def test_the_estimate_follows_the_measured_peak_of_a_step(loaded, layout, cfg):
    model = loaded(layout)
    cond = model.encode_text("a red circle")
    shape = (1, 16, SIDE // 8, SIDE // 8)
    measured = max(model.pool.submit(step_memory_growth, cond, shape, cfg, result_rank="all").result(900))
    tokens = cond.prompt_embeds.shape[1]
    estimate = sampling_bytes_per_rank(model.info, layout, shape, tokens, cfg != 1.0, "fp32")
    assert 0.7 < estimate / measured < 1.4, (estimate / 2**20, measured / 2**20)


def test_a_job_too_big_for_the_free_memory_is_refused_before_anything_is_sent(loaded):
    layout = ParallelConfig(ulysses=2)
    model = loaded(layout)
    cond = model.encode_text("a red circle")
    side = 16384  # ComfyUI's largest size: a million tokens
    per_item = sampling_bytes_per_rank(model.info, layout, (1, 16, side // 8, side // 8), 512, False, "fp32")
    batch = min(4096, math.ceil(2 * available_ram() / (2 * per_item)))  # twice what the machine has
    before, t0 = model.pool.submitted, time.monotonic()
    with pytest.raises(ConfigError) as info:
        model.sample(cond, None, None, side, side, batch_size=batch, steps=1)
    message = str(info.value)
    assert "GiB of activations per rank" in message and "GiB available" in message and "fix:" in message
    assert model.pool.submitted == before and time.monotonic() - t0 < 2.0  # nothing sent, nothing allocated
    assert model.sample(cond, None, None, 64, 64, steps=1).shape == (1, 16, 8, 8)  # a job that fits runs
