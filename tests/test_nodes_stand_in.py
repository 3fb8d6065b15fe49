"""The node layer driven by a stand-in model (tests/node_helpers.FakeModel), in milliseconds: the sampler's
progress, previews, status events and cancel; text encode, VAE decode and unload."""

from __future__ import annotations

import threading

import pytest
import torch
from node_helpers import Interrupted, RecordingBridge, fake_handle, flux_cond  # tests/ helpers
from pack_import import load_pack

from parallel_runtime.errors import ConfigError, JobCancelled

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.text_encode import ParallelTextEncode  # noqa: E402
from dit_parallel_pack.nodes.unload import ParallelRuntimeUnload  # noqa: E402
from dit_parallel_pack.nodes.vae_decode import ParallelVAEDecode  # noqa: E402


def test_sampler_progress_previews_and_status(fake_ctx):
    bridge = fake_ctx.bridge
    handle = fake_handle(fake_ctx)
    latent = ParallelEmptyLatent().generate(handle, 64, 48, 1)[0]
    assert latent["samples"].shape == (1, 16, 6, 8)
    latent["batch_index"] = [3]
    result = ParallelSampler(fake_ctx).sample(
        handle, flux_cond(guidance=2.0), flux_cond(), latent, 7, 4, 1.0, "euler", "simple", 1.0, guidance=3.5
    )
    (out,) = result["result"]
    assert "model sampling" in result["ui"]["text"][0]
    assert out["samples"].shape == (1, 16, 6, 8) and torch.all(out["samples"] == 1.0)
    assert out["batch_index"] == [3]  # carried to the output LATENT, as KSampler does
    call = handle.fake.calls[-1]
    assert (call["width"], call["height"], call["guidance"], call["seed"]) == (64, 48, 3.5, 7)
    assert call["positive"][0].guidance == 2.0 and call["negative"][0].guidance is None  # per entry
    assert call["batch_index"] == [3]
    values = [v for v, _, _ in bridge.progress]
    assert values == [1, 2, 3, 4]  # one update per step (when both ranks reported it), in order
    assert [int(p[0, 0, 0]) for p in bridge.previews] == [1, 2, 3, 4]  # each step's picture, in order
    assert all(p is not None for _, _, p in bridge.progress)  # each step's update carries its preview
    assert bridge.threads == {threading.current_thread().name}  # ComfyUI is called from the node's thread
    kinds = [e["type"] for e in bridge.status]
    assert "pool" in kinds and "progress" in kinds and "memory" in kinds
    jobs = [e["state"] for e in bridge.status if e["type"] == "job"]
    assert jobs == ["running", "done"]
    ranks = {e["rank"] for e in bridge.status if e["type"] == "progress"}
    assert ranks == {0, 1}
    snap = fake_ctx.status.snapshot()["pools"][0]
    assert snap["ranks"]["1"]["step"] == 4 and snap["ranks"]["1"]["patches"] == 2


def test_sampler_cancel_through_interrupt_flag():
    bridge = RecordingBridge(cancel_after=2)
    ctx = NodeContext.create(registry=object(), bridge=bridge)
    handle = fake_handle(ctx)
    latent = {"samples": torch.zeros(1, 16, 4, 4)}
    with pytest.raises(Interrupted) as err:
        ParallelSampler(ctx).sample(handle, flux_cond(), flux_cond(), latent, 0, 50, 1.0, "euler", "simple", 1.0)
    assert isinstance(err.value.__cause__, JobCancelled)
    assert len(bridge.progress) < 50
    assert [e["state"] for e in bridge.status if e["type"] == "job"] == ["running", "cancelled"]


def test_sampler_wrong_conditioning_shape(fake_ctx):
    handle = fake_handle(fake_ctx)
    latent = {"samples": torch.zeros(1, 16, 4, 4)}
    with pytest.raises(ConfigError, match="SDXL conditioning given to a Flux model"):
        ParallelSampler(fake_ctx).sample(
            handle, flux_cond(width=2048, pooled=1280), flux_cond(), latent, 0, 2, 1.0, "euler", "simple", 1.0
        )


def test_text_encode_and_decode_with_stand_in(fake_ctx):
    handle = fake_handle(fake_ctx)
    (cond,) = ParallelTextEncode().encode(handle, "a fox")
    assert cond[0][0].shape == (1, 5, 32) and cond[0][1]["pooled_output"].shape == (1, 32)
    (image,) = ParallelVAEDecode(fake_ctx).decode(handle, {"samples": torch.zeros(2, 16, 4, 6)})
    assert image.shape == (2, 32, 48, 3) and image.min() >= 0.0 and image.max() <= 1.0
    with pytest.raises(ConfigError, match="samples is not a LATENT"):  # the service's check (and its channel
        ParallelVAEDecode(fake_ctx).decode(handle, torch.zeros(1, 16, 4, 4))  # check: tests/test_input_checks.py)
    assert [e["state"] for e in fake_ctx.bridge.status if e["type"] == "job"][-1] == "error"


def test_unload_node(fake_ctx):
    handle = fake_handle(fake_ctx)
    handle.model()
    result = ParallelRuntimeUnload(fake_ctx).unload(parallel_model=handle)
    assert handle.fake.unloaded and "unloaded" in result["ui"]["text"][0]
    assert fake_ctx.bridge.status[-1] == {"type": "pool_closed", "pool": handle.pool_id}
