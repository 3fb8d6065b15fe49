"""The model API after failures and on bad input (real workers, tiny models): the next job after
a death reloads and runs, a load stops when cancelled, non-finite numbers and out-of-range work
are refused before any job, a step that turns NaN is named, and every error says what, why and
how to fix it."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError, JobCancelled, RuntimeTimeout, WorkerDied, WorkerError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.sampling_spec import flux_sampling
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.runtime.pool import WorkerPool
from parallel_runtime.runtime.pools import PoolRegistry
from parallel_runtime.service.api import LoadRequest, _load_into, check_sample_request, load_parallel_model
from parallel_runtime.service.image_size import SizeAdjusted
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.lora import LoraSpec
from tests.dist_jobs.runtime_jobs import slow_component_loads
from tests.leftovers import assert_gone, exited

DATA = Path(__file__).parent / "data"
FLUX = LoadRequest("tiny-flux", "cpu:2", threads_per_worker=1)


@pytest.fixture(scope="module")
def registry():
    registry = PoolRegistry(max_pools=2)
    yield registry
    registry.close_all()


@pytest.fixture(scope="module")
def flux(registry):
    model = load_parallel_model(FLUX, registry)
    return model, model.encode_text("a fox")


def _sample(model, positive, **overrides):
    args = dict(negative=None, latent=None, width=64, height=64, steps=2, seed=3)
    args.update(overrides)
    return model.sample(positive, **args)


@pytest.mark.parametrize("how", ["idle kill", "kill mid-sample", "abort"])
def test_the_next_job_after_a_death_reloads_and_runs(flux, how):
    model, positive = flux
    expected = _sample(model, positive)
    old_pids, old_prefix = model.pool.pids, model.pool.shm_prefix
    if how == "idle kill":
        pid = model.pool.pids[1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10.0  # gone before the next job is sent: killed while idle
        while not exited(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    elif how == "abort":
        model.pool.abort("test")
    else:
        pid = model.pool.pids[1]
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        with pytest.raises(WorkerDied):
            _sample(model, positive, steps=500)
    assert torch.equal(_sample(model, positive), expected)  # same seed, freshly reloaded weights
    assert_gone(old_pids, old_prefix, within=3.0)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"cfg": math.nan}, "cfg is nan"),
        ({"cfg": math.inf}, "cfg is inf"),
        ({"guidance": math.nan}, "guidance is nan"),
        ({"latent": torch.full((1, 16, 8, 8), math.nan)}, "LATENT holds 1024 NaN"),
        ({"sigmas": torch.tensor([1.0, math.nan, 0.0])}, "SIGMAS input holds 1 NaN"),
        ({"steps": 10_000_000}, "steps=10000000 is out of range"),
        ({"steps": "3"}, "steps='3' is not a whole number"),
        ({"denoise": 1e-9}, "schedule of 2e+09 sigmas"),
        ({"seed": -1}, "seed=-1 is out of range"),
        ({"batch_size": 0}, "batch_size=0 is out of range"),
        ({"width": 1 << 20}, "width=1048576 is out of range"),
    ],
)
def test_bad_numbers_are_refused_before_any_job(flux, overrides, needle):
    model, positive = flux
    before = model.pool.submitted
    with pytest.raises(ConfigError) as info:
        _sample(model, positive, **overrides)
    assert needle in str(info.value) and "fix:" in str(info.value)
    assert model.pool.submitted == before


def test_missing_or_broken_conditioning_and_prompts_are_named(flux):
    model, positive = flux
    before = model.pool.submitted
    with pytest.raises(ConfigError, match="no positive conditioning was given"):
        model.sample(None, None, None, 64, 64, steps=2)
    bad = Conditioning(positive.prompt_embeds * math.nan, positive.pooled)
    with pytest.raises(ConfigError, match="positive conditioning's embeddings holds"):
        _sample(model, bad)
    with pytest.raises(ConfigError, match="no prompt to encode"):
        model.encode_text([])
    with pytest.raises(ConfigError, match="cannot decode a LATENT"):
        model.decode(torch.zeros(1, 16, 0, 4))
    assert model.pool.submitted == before


def test_conditioning_and_latents_the_model_cannot_take_are_refused_on_the_host(flux):
    """What expected_conditioning() and the latent tell before any job: never a remote traceback."""
    model, positive = flux
    embeds, pooled = positive.prompt_embeds, positive.pooled  # tiny-flux: 32 wide, pooled 32 wide
    cases = [
        (Conditioning(torch.randn(1, 8, 48), pooled), {}, "text embeddings are 48 wide but this flux model takes 32"),
        (Conditioning(embeds, torch.randn(1, 7)), {}, "pooled output is 7 wide but this flux model takes 32"),
        (Conditioning(embeds), {}, "has no pooled output, which this flux model needs"),
        (Conditioning(embeds, pooled, torch.ones(1, 3)), {}, "attention mask has shape (1, 3) for 512 text tokens"),
        (
            Conditioning(embeds.repeat(3, 1, 1), pooled.repeat(3, 1)),
            {"latent": torch.zeros(2, 16, 8, 8)},
            "batch sizes {'prompt_embeds': 3, 'pooled': 3} but the latent has batch 2",
        ),
        (positive, {"latent": torch.zeros(0, 16, 8, 8)}, "the LATENT has shape [0, 16, 8, 8]"),
    ]
    before = model.pool.submitted
    for cond, overrides, needle in cases:
        with pytest.raises(ConfigError) as info:
            _sample(model, cond, **overrides)
        assert needle in str(info.value) and "fix:" in str(info.value), info.value
    # A negative the sampler uses is checked too; one it skips (cfg 1) is not its concern.
    wrong = Conditioning(torch.randn(1, 8, 48), pooled)
    with pytest.raises(ConfigError, match="negative conditioning's text embeddings are 48 wide"):
        _sample(model, positive, negative=wrong, cfg=2.0)
    with pytest.raises(ConfigError, match=r"prompt 2 holds a lone surrogate \(U\+D800\) at character 1"):
        model.encode_text(["a fox", "a\ud800b"])
    assert model.pool.submitted == before
    # Conditioning for one latent shared by a batch, and one per latent, both sample.
    assert _sample(model, positive, latent=torch.zeros(2, 16, 8, 8), steps=1).shape[0] == 2


def test_a_size_the_vae_cannot_make_is_rounded_with_a_warning_before_the_job(flux):
    """--width 100 made a 96 px picture and said so only in its size: now the API warns at the start."""
    model, positive = flux
    seen_at_first_event: list[int] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def on_event(rank, kind, payload):
            if not seen_at_first_event:
                seen_at_first_event.append(len([w for w in caught if w.category is SizeAdjusted]))

        out = _sample(model, positive, width=100, height=70, steps=1, on_event=on_event)
    adjusted = [str(w.message) for w in caught if w.category is SizeAdjusted]
    assert out.shape[-2:] == (8, 12)  # 64 x 96 px: rounded down to the VAE's 8 px, as EmptyLatentImage does
    assert len(adjusted) == 1 and seen_at_first_event == [1]
    assert "the picture will be 96x64 px, not 100x70" in adjusted[0] and "or ask for 104" in adjusted[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SizeAdjusted)  # a size the model takes as it is: no warning
        assert _sample(model, positive, width=96, height=64, steps=1).shape[-2:] == (8, 12)
    with pytest.raises(ConfigError, match="width 5 px is smaller than 8 px"):
        _sample(model, positive, width=5)
    # The CLI's check before it loads says the same
    size = check_sample_request(
        FLUX, 100, 70, batch_size=1, seed=0, steps=1, cfg=1.0, denoise=1.0, guidance=None, sampler="euler",
        scheduler="simple",
    )  # fmt: skip
    assert (size.width, size.height, size.message()) == (96, 64, adjusted[0])


def test_a_step_that_turns_nan_is_named(registry, tmp_path):
    folder = tmp_path / "nan-flux"
    shutil.copytree(ensure_tiny_model("tiny-flux"), folder)
    weights = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    state["proj_out.weight"] = torch.full_like(state["proj_out.weight"], math.inf)
    save_file(state, weights)
    model = load_parallel_model(LoadRequest(str(folder), "cpu:2", threads_per_worker=1), registry)
    positive = model.encode_text("a fox")
    with pytest.raises(WorkerError) as info:
        _sample(model, positive)
    assert info.value.exc_type == "NonFiniteValues"
    assert "denoising step 1/2 produced NaN or infinite values" in str(info.value) and "fix:" in str(info.value)
    assert model.pool.is_alive  # every rank raised at the same step: nobody was left in a collective


def test_load_settings_are_checked_before_any_worker_starts():
    registry = PoolRegistry()
    try:
        for request, needle in [
            (LoadRequest("tiny-flux", "cpu:2", attention="bogus"), "unknown attention backend 'bogus'"),
            (LoadRequest("tiny-flux", "cpu:2", dtype="fp13"), "unknown dtype 'fp13'"),
        ]:
            t0 = time.monotonic()
            with pytest.raises(ConfigError, match=needle):
                load_parallel_model(request, registry)
            assert time.monotonic() - t0 < 2.0 and registry.pools() == []
    finally:
        registry.close_all()


def test_a_damaged_single_file_is_refused_on_the_host(tmp_path):
    good = tmp_path / "flux.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(12, 4)}, good)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-8])
    registry = PoolRegistry()
    try:
        with pytest.raises(ConfigError, match="cut.safetensors: tensor .* ends at byte"):
            load_parallel_model(LoadRequest(str(cut), "cpu:2"), registry)
        assert registry.pools() == []
    finally:
        registry.close_all()


def test_cancel_during_a_model_load_stops_it_at_the_next_component():
    """Each component takes 1.5 s more to load (5 of them on each rank: >= 7.5 s a load). A load
    cancelled 1 s in stops at the next component: well under half the time of a whole load,
    measured in the same test."""
    path = str(ensure_tiny_model("tiny-flux"))
    with WorkerPool(
        "cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1, worker_setup=(slow_component_loads, (1.5,))
    ) as pool:
        fut = pool.submit(load_model, path)
        time.sleep(1.0)
        t0 = time.monotonic()
        with pytest.raises(JobCancelled):
            fut.wait(should_cancel=lambda: True)  # the default grace (60 s): the load itself must stop
        cancelled_s = time.monotonic() - t0
        assert pool.starts == 1  # stopped cooperatively, not by restarting the workers
        t0 = time.monotonic()
        assert pool.submit(load_model, path).result(300)["family"] == "flux"
        whole_s = time.monotonic() - t0
        assert cancelled_s < 0.5 * whole_s, (cancelled_s, whole_s)


def test_load_parallel_model_takes_a_cancel_request():
    """The API passes should_cancel to the load: it ends JobCancelled (cooperatively, or by a restart
    when the load does not reach a safe point within LOAD_CANCEL_GRACE_S), and the next load works."""
    registry = PoolRegistry()
    try:
        with pytest.raises(JobCancelled):
            load_parallel_model(
                LoadRequest("tiny-flux", "cpu:2", threads_per_worker=1), registry, should_cancel=lambda: True
            )
        model = load_parallel_model(LoadRequest("tiny-flux", "cpu:2", threads_per_worker=1), registry)
        assert model.family == "flux"
    finally:
        registry.close_all()


def test_a_reload_after_a_death_brings_back_the_lora_stack_and_model_sampling(registry, tmp_path):
    """A view with a LoRA stack and its own model sampling, whose worker is killed: its next sample
    reloads the model and equals the one before, bit for bit (the stack and the sampling travel with
    every job, so the reloaded workers apply both again); the plain model's output is unchanged too."""
    import lora_files as lf

    ref = json.loads((DATA / "comfy_lora_reference.json").read_text())
    path = lf.write_model(ref["models"]["flux"]["skeleton"], str(tmp_path / "tiny_flux.safetensors"))
    model = load_parallel_model(LoadRequest(path, "cpu:2", threads_per_worker=1), registry)
    loras = [LoraSpec.of(DATA / "lora" / f"{stem}.safetensors", s, 0.0) for stem, s in ref["cases"]["flux"]["stack"]]
    shifted = flux_sampling(3.0, "test")
    views = {
        "plain": model,
        "lora": model.with_loras(*loras),
        "sampling": model.with_model_sampling(shifted),
        "both": model.with_loras(*loras).with_model_sampling(shifted),
    }
    positive = Conditioning(*lf.conditioning("flux.positive", ref["tokens"], 32, 32))
    latent = torch.zeros(ref["latent_shape"])
    side = latent.shape[-1] * 8

    def run(view) -> torch.Tensor:
        return view.sample(positive, None, latent, side, side, steps=2, seed=3)

    before = {name: run(view) for name, view in views.items()}
    for name in ("plain", "lora", "sampling"):
        assert not torch.equal(before[name], before["both"]), f"{name}: the LoRA and the sampling both change it"
    pid = model.pool.pids[1]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while not exited(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    generation = model.pool.starts
    assert torch.equal(run(views["both"]), before["both"])
    assert model.pool.starts == generation + 1  # reloaded once, into fresh workers
    assert torch.equal(run(views["plain"]), before["plain"])  # the stack left the weights again


def test_a_load_past_load_timeout_s_is_abandoned_naming_the_setting():
    """Each component takes 3 s more to load (>= 15 s a load): with load_timeout_s=2 the load ends
    after about 2 s with an error naming the setting, and the workers are replaced."""
    path = ensure_tiny_model("tiny-flux")
    request = LoadRequest(str(path), "cpu:2", threads_per_worker=1, load_timeout_s=2.0)
    with WorkerPool(
        "cpu:2", ParallelConfig(ulysses=2), threads_per_worker=1, worker_setup=(slow_component_loads, (3.0,))
    ) as pool:
        generation = pool.ensure_started()
        t0 = time.monotonic()
        with pytest.raises(RuntimeTimeout, match=r"ran past load_timeout_s=2 s.*raise LoadRequest.load_timeout_s"):
            _load_into(pool, path, request, generation, None)
        assert time.monotonic() - t0 < 6.0
        assert not pool.is_alive  # the workers are replaced before the next job
