"""Shared pieces of the node tests (tests/test_nodes_*.py and the family node tests): a bridge that records
what the nodes tell ComfyUI, a stand-in model that follows the ParallelModel API, FLUX-style CONDITIONING,
and the Parallel Model Loader's widget values on two CPU workers."""

from __future__ import annotations

import threading
from typing import Any

import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.errors import JobCancelled

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.handles import ParallelModelHandle  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402


class Interrupted(Exception):
    """Stands in for ComfyUI's InterruptProcessingException."""


class RecordingBridge:
    """A bridge that records what the nodes tell ComfyUI. ``cancel_after`` progress events it
    reports the user's Cancel (like ComfyUI's interrupt flag)."""

    def __init__(self, cancel_after: int | None = None, folders: dict[str, list[str]] | None = None):
        self.cancel_after = cancel_after
        self.folders = folders or {}
        self.progress: list[tuple[int, int | None, Any]] = []
        self.previews: list[torch.Tensor] = []  # the RGB pictures the nodes showed (uint8 [H, W, 3])
        self.status: list[dict] = []
        self.freed: list[list[str]] = []
        self.threads: set[str] = set()
        self.interrupt_checks = 0

    def available(self) -> bool:
        return False

    def folder_paths(self, kind: str) -> list[str]:
        return self.folders.get(kind, [])

    def progress_bar(self, total: int):
        bridge = self

        class Bar:
            def update_absolute(self, value, total=None, preview=None):
                bridge.threads.add(threading.current_thread().name)
                bridge.progress.append((value, total, preview))
                if preview is not None:
                    bridge.previews.append(preview)

        return Bar()

    def interrupted(self) -> bool:
        self.interrupt_checks += 1
        return self.cancel_after is not None and len(self.progress) >= self.cancel_after

    def raise_interrupted(self, cause: BaseException) -> None:
        raise Interrupted("cancelled by the user") from cause

    def is_interrupt(self, exc: BaseException) -> bool:
        return isinstance(exc, Interrupted)

    def free_memory_for(self, devices) -> None:
        self.freed.append(list(devices))

    def send_status(self, payload: dict) -> None:
        self.status.append(payload)

    def on_free_requested(self, callback) -> None:
        pass

    def on_memory_needed(self, callback) -> None:
        pass


class FakeModel:
    """Follows the ParallelModel API: emits progress/preview/memory events and honours cancel."""

    def __init__(self, family: str = "flux", channels: int = 16, embed_dim: int = 32, pooled_dim: int | None = 32):
        self.family, self.latent_channels, self.spatial_factor = family, channels, 8
        self.latent_dims, self.temporal_factor, self.patch_pixels = 2, 1, 16
        self.embed_dim, self.pooled_dim = embed_dim, pooled_dim
        self.calls: list[dict] = []
        self.unloaded = False

    def expected_conditioning(self) -> dict:
        return {"embed_dim": self.embed_dim, "pooled_dim": self.pooled_dim}

    def encode_text(self, prompt: str):
        from parallel_runtime.models.base import Conditioning

        pooled = torch.ones(1, self.pooled_dim) if self.pooled_dim else None
        return Conditioning(torch.full((1, 5, self.embed_dim), float(len(prompt))), pooled)

    def sample(
        self,
        positive,
        negative,
        latent,
        *,
        width,
        height,
        batch_size,
        seed,
        steps,
        cfg,
        sampler_name,
        scheduler,
        denoise=1.0,
        sigmas=None,
        guidance=None,
        batch_index=None,
        on_event=None,
        should_cancel=None,
    ):
        self.calls.append(
            dict(
                positive=positive,
                negative=negative,
                width=width,
                height=height,
                guidance=guidance,
                batch_index=batch_index,
                seed=seed,
                steps=steps,
                cfg=cfg,
                sampler=sampler_name,
                scheduler=scheduler,
            )
        )
        for step in range(1, steps + 1):
            if should_cancel is not None and should_cancel():
                raise JobCancelled("job 'sample' was cancelled")
            picture = torch.full((4, 4, 3), step, dtype=torch.uint8)
            on_event(0, "preview", {"step": step, "image": picture})  # before progress, as workers do
            for rank in (0, 1):
                on_event(rank, "progress", {"step": step, "total": steps, "patch": 0, "patches": 2})
            threading.Event().wait(0.01)
        on_event(0, "memory", {"rss_bytes": 1 << 20})
        return latent + 1.0

    def check_latent_size(self, height, width) -> None:
        self.checked_sizes = (height, width)

    def decode(self, latent):
        b, _, h, w = latent.shape
        return torch.rand(b, h * 8, w * 8, 3)

    def unload(self) -> None:
        self.unloaded = True


class FakeHandle(ParallelModelHandle):
    def model(self):
        self.context.status.pool_loaded(self.pool_id, self.name, self.family, self.devices, self.layout, self.reason)
        self._last = self.fake
        return self.fake


def fake_handle(ctx: NodeContext, model: FakeModel | None = None) -> FakeHandle:
    model = model or FakeModel()
    handle = FakeHandle(None, ctx, "fake", model.family, ("cpu", "cpu"), "ulysses=2", "test")
    handle.fake = model
    return handle


def fake_context() -> NodeContext:
    """A NodeContext without a pool registry whose bridge records what the nodes tell ComfyUI."""
    bridge = RecordingBridge()
    return NodeContext.create(registry=object(), bridge=bridge)


def flux_cond(width: int = 32, pooled: int | None = 32, **extra) -> list:
    options = {"pooled_output": torch.randn(1, pooled)} if pooled else {}
    options.update(extra)
    return [[torch.randn(1, 7, width), options]]


LOAD = dict(
    devices="cpu:2",
    ulysses=1,
    ring=1,
    cfg_parallel=1,
    pipefusion=1,
    pp_patches=0,
    pp_warmup=1,
    dtype="fp32",
    attention="auto",
)


def load(ctx, model: str, layout: str = "auto", **degrees):
    result = ParallelModelLoader(ctx).load(model=model, family="auto", layout=layout, **{**LOAD, **degrees})
    (handle,) = result["result"]
    return handle, result["ui"]["text"][0]
