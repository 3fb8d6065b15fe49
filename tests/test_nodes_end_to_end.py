"""Every node end to end on the tiny families with the real runtime on two CPU workers: a workflow's
text encode -> empty latent -> sampler -> VAE decode, cancel, ComfyUI-style conditioning, unload and reuse."""

from __future__ import annotations

import pytest
import torch
from node_helpers import Interrupted, RecordingBridge, load  # tests/ helpers
from pack_import import load_pack

from parallel_runtime.errors import ConfigError, JobCancelled
from parallel_runtime.parallel.config import ParallelConfig

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.text_encode import ParallelTextEncode  # noqa: E402
from dit_parallel_pack.nodes.unload import ParallelRuntimeUnload  # noqa: E402
from dit_parallel_pack.nodes.vae_decode import ParallelVAEDecode  # noqa: E402


@pytest.fixture(scope="module")
def real_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=RecordingBridge())


def api():
    from parallel_runtime.service import api as service_api

    return service_api


def run_graph(ctx, handle, cfg: float, steps: int = 2, size: int = 64):
    """Text encode -> empty latent -> sampler -> VAE decode, as a workflow would."""
    (pos,) = ParallelTextEncode().encode(handle, "a watercolor fox")
    (neg,) = ParallelTextEncode().encode(handle, "")
    (latent,) = ParallelEmptyLatent().generate(handle, size, size, 1)
    (out,) = ParallelSampler(ctx).sample(handle, pos, neg, latent, 3, steps, cfg, "euler", "simple", 1.0)["result"]
    (image,) = ParallelVAEDecode(ctx).decode(handle, out)
    return latent, out, image


@pytest.mark.parametrize(
    ("model", "layout", "degrees", "cfg", "expect"),
    [
        ("tiny-flux", "auto", {}, 1.0, ParallelConfig(ulysses=2)),
        ("tiny-sd3", "auto", {}, 4.5, ParallelConfig(cfg=2)),
        ("tiny-pixart", "auto", {}, 4.5, ParallelConfig(cfg=2)),
        pytest.param(
            "tiny-pixart", "manual", {"pipefusion": 2, "pp_patches": 2}, 4.5, ParallelConfig(pp=2), id="pixart-pp2"
        ),
    ],
)
def test_end_to_end_tiny_families(real_ctx, model, layout, degrees, cfg, expect):
    if expect.pp > 1 and "pp_patches" not in {f.name for f in __import__("dataclasses").fields(api().LoadRequest)}:
        pytest.skip("PipeFusion is not in parallel_runtime.service.api yet (LoadRequest has no pp_patches)")
    freed = len(real_ctx.bridge.freed)
    handle, text = load(real_ctx, model, layout, **degrees)
    assert handle.request.layout == expect
    assert model in text and expect.describe() in text
    latent, out, image = run_graph(real_ctx, handle, cfg)
    channels = 4 if model == "tiny-pixart" else 16
    assert latent["samples"].shape == out["samples"].shape == (1, channels, 8, 8)
    assert torch.isfinite(out["samples"]).all() and not torch.equal(out["samples"], latent["samples"])
    assert image.shape == (1, 64, 64, 3) and image.dtype == torch.float32
    assert float(image.min()) >= 0.0 and float(image.max()) <= 1.0
    assert len(real_ctx.bridge.freed) == freed + 1  # ComfyUI's models are evicted once, when the workers start
    panel = real_ctx.status.snapshot()["pools"]
    entry = next(p for p in panel if p["pool"] == handle.pool_id)
    assert entry["layout"] == expect.describe() and entry["job"] == {"job": "decode", "state": "done"}
    ranks = range(len(handle.devices))
    assert all("memory" in entry["ranks"][str(r)] for r in ranks), "every rank reports its memory"
    steps = [e for e in real_ctx.bridge.status if e["type"] == "progress" and e["pool"] == handle.pool_id]
    assert {e["rank"] for e in steps if e["step"] == e["total"] == 2} == set(ranks), "every rank reports its steps"


def test_auto_layout_reads_free_memory_after_comfyuis_models_left(real_ctx, monkeypatch):
    """The auto plan reads the GPUs' free memory: ComfyUI's own models are evicted first, once."""
    from parallel_runtime.parallel import machine

    detect, seen = machine.MachineInfo.detect, []

    def recording_detect(*args, **kwargs):
        seen.append(len(real_ctx.bridge.freed))
        return detect(*args, **kwargs)

    monkeypatch.setattr(machine.MachineInfo, "detect", staticmethod(recording_detect))
    before = len(real_ctx.bridge.freed)
    load(real_ctx, "tiny-flux", "auto")
    assert seen == [before + 1], "free memory was read before ComfyUI's models left the devices"
    assert len(real_ctx.bridge.freed) == before + 1 and real_ctx.bridge.freed[-1] == ["cpu", "cpu"]


def test_end_to_end_cancel_keeps_pool_warm_and_previews(pool_registry):
    bridge = RecordingBridge(cancel_after=1)
    ctx = NodeContext.create(registry=pool_registry, bridge=bridge)
    handle, _ = load(ctx, "tiny-flux")
    (pos,) = ParallelTextEncode().encode(handle, "a fox")
    latent = {"samples": torch.zeros(1, 16, 8, 8)}
    with pytest.raises(Interrupted) as err:
        ParallelSampler(ctx).sample(handle, pos, pos, latent, 0, 200, 1.0, "euler", "simple", 1.0)
    assert isinstance(err.value.__cause__, JobCancelled)
    bridge.cancel_after = None
    (out,) = ParallelSampler(ctx).sample(handle, pos, pos, latent, 0, 2, 1.0, "euler", "simple", 1.0)["result"]
    assert out["samples"].shape == (1, 16, 8, 8)  # the same warm pool still works
    assert bridge.previews, "the runtime's preview events reach the bridge"


def test_end_to_end_comfy_conditioning_of_the_wrong_shape(real_ctx):
    handle, _ = load(real_ctx, "tiny-flux")
    latent = {"samples": torch.zeros(1, 16, 8, 8)}
    sdxl = [[torch.randn(1, 77, 2048), {"pooled_output": torch.randn(1, 1280)}]]
    with pytest.raises(ConfigError, match="SDXL conditioning given to a Flux model"):
        ParallelSampler(real_ctx).sample(handle, sdxl, sdxl, latent, 0, 2, 1.0, "euler", "simple", 1.0)
    (pos,) = ParallelTextEncode().encode(handle, "x")
    odd = {"samples": torch.zeros(1, 16, 9, 7)}  # 56x72 px: padded to whole tokens and cropped, as KSampler
    (out,) = ParallelSampler(real_ctx).sample(handle, pos, pos, odd, 0, 2, 1.0, "euler", "simple", 1.0)["result"]
    assert out["samples"].shape == (1, 16, 9, 7) and torch.isfinite(out["samples"]).all()


def test_end_to_end_comfy_style_conditioning_is_accepted(real_ctx):
    """CONDITIONING built like ComfyUI's encoders (embeddings + pooled_output + FluxGuidance)."""
    handle, _ = load(real_ctx, "tiny-flux")
    model = handle.model()
    exp = model.expected_conditioning()
    cond = [
        [torch.randn(1, 12, exp["embed_dim"]), {"pooled_output": torch.randn(1, exp["pooled_dim"]), "guidance": 4.0}]
    ]
    (out,) = ParallelSampler(real_ctx).sample(
        handle, cond, cond, {"samples": torch.zeros(1, 16, 8, 8)}, 1, 2, 1.0, "euler", "simple", 1.0
    )["result"]
    assert out["samples"].shape == (1, 16, 8, 8)


def test_end_to_end_unload_then_reuse_handle(pool_registry):
    from parallel_runtime.runtime.pools import PoolRegistry

    registry = PoolRegistry(max_pools=1)  # own registry: unloading must not close the session's pools
    try:
        ctx = NodeContext.create(registry=registry, bridge=RecordingBridge())
        handle, _ = load(ctx, "tiny-flux", "manual", devices="cpu:1")
        pids = [p.pids for p in registry.pools()]
        ParallelRuntimeUnload(ctx).unload()
        assert registry.pools() == [] or not any(p.is_alive for p in registry.pools())
        assert ctx.bridge.status[-1] == {"type": "reset"}
        (latent,) = ParallelEmptyLatent().generate(handle, 32, 32, 1)  # the cached handle starts workers again
        assert latent["samples"].shape == (1, 16, 4, 4)
        assert [p.pids for p in registry.pools()] != pids
    finally:
        registry.close_all()


def test_end_to_end_unload_one_model_then_reuse():
    from parallel_runtime.runtime.pools import PoolRegistry

    registry = PoolRegistry(max_pools=1)
    try:
        ctx = NodeContext.create(registry=registry, bridge=RecordingBridge())
        handle, _ = load(ctx, "tiny-flux", "manual", devices="cpu:1")
        ParallelRuntimeUnload(ctx).unload(parallel_model=handle)
        assert ctx.bridge.status[-1] == {"type": "pool_closed", "pool": handle.pool_id}
        (latent,) = ParallelEmptyLatent().generate(handle, 32, 32, 1)
        assert latent["samples"].shape == (1, 16, 4, 4)
    finally:
        registry.close_all()
