"""The ComfyUI nodes, without ComfyUI.

Part 1 drives the node layer with a stand-in model (conditioning checks, progress, previews,
cancel, status events) so it runs in milliseconds. Part 2 runs every node end to end on the tiny
families with the real runtime on two CPU workers (skipped while ``parallel_runtime.service.api`` is
missing).
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from typing import Any

import pytest
import torch
from pack_import import ROOT, load_pack  # tests/ helper

from parallel_runtime.errors import ConfigError, JobCancelled
from parallel_runtime.parallel.config import ParallelConfig

PACK = load_pack()
from dit_parallel_pack.nodes import NODE_CLASS_MAPPINGS  # noqa: E402
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.conditioning import from_runtime, to_branch  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.handles import ParallelModelHandle  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader, manual_layout  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler, prepare_latent  # noqa: E402
from dit_parallel_pack.nodes.text_encode import ParallelTextEncode  # noqa: E402
from dit_parallel_pack.nodes.unload import ParallelRuntimeUnload  # noqa: E402
from dit_parallel_pack.nodes.vae_decode import ParallelVAEDecode  # noqa: E402


class Interrupted(Exception):
    """Stands in for ComfyUI's InterruptProcessingException."""


class RecordingBridge:
    """A bridge that records what the nodes tell ComfyUI. ``cancel_after`` progress events it
    reports the user's Cancel (like ComfyUI's interrupt flag)."""

    def __init__(self, cancel_after: int | None = None, folders: dict[str, list[str]] | None = None):
        self.cancel_after = cancel_after
        self.folders = folders or {}
        self.progress: list[tuple[int, int | None, Any]] = []
        self.previews: list[tuple[str, tuple[int, ...]]] = []
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

        return Bar()

    def preview_image(self, family: str, latent: Any) -> Any:
        self.previews.append((family, tuple(latent.shape)))
        return ("JPEG", f"preview-{len(self.previews)}", 512)

    def interrupted(self) -> bool:
        self.interrupt_checks += 1
        return self.cancel_after is not None and len(self.progress) >= self.cancel_after

    def raise_interrupted(self, cause: BaseException) -> None:
        raise Interrupted("cancelled by the user") from cause

    def free_memory_for(self, devices) -> None:
        self.freed.append(list(devices))

    def send_status(self, payload: dict) -> None:
        self.status.append(payload)

    def on_free_requested(self, callback) -> None:
        pass

    def on_memory_needed(self, callback) -> None:
        pass


# -- part 1: the node layer with a stand-in model -------------------------------------------------
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
            on_event(0, "preview", {"step": step, "latent": latent[:1, :, :4, :4]})  # before progress, as workers do
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


@pytest.fixture
def fake_ctx():
    bridge = RecordingBridge()
    return NodeContext.create(registry=object(), bridge=bridge)


def flux_cond(width: int = 32, pooled: int | None = 32, **extra) -> list:
    options = {"pooled_output": torch.randn(1, pooled)} if pooled else {}
    options.update(extra)
    return [[torch.randn(1, 7, width), options]]


def test_node_mappings_are_classic_nodes():
    assert set(NODE_CLASS_MAPPINGS) == set(PACK.NODE_DISPLAY_NAME_MAPPINGS)
    assert PACK.WEB_DIRECTORY == "./web"
    for cls in NODE_CLASS_MAPPINGS.values():
        assert cls.CATEGORY == "DiT Parallel"
        assert isinstance(cls.RETURN_TYPES, tuple) and callable(getattr(cls, cls.FUNCTION))
        spec = cls.INPUT_TYPES()
        for section in spec.values():
            for name, entry in section.items():
                assert "tooltip" in entry[1], f"{cls.__name__}.{name} has no tooltip"


def test_pack_import_is_light():
    import subprocess

    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('p', {str(ROOT / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(ROOT)!r}]); m = importlib.util.module_from_spec(spec); "
        "sys.modules['p'] = m; spec.loader.exec_module(m); "
        "print(sorted(k for k in ('torch', 'diffusers', 'transformers') if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_bridge_without_comfyui_is_a_no_op():
    bridge = ComfyBridge()
    assert bridge.available() is False
    assert bridge.interrupted() is False
    bridge.progress_bar(10).update_absolute(3, 10, None)
    assert bridge.preview_image("flux", torch.zeros(1, 16, 4, 4)) is None
    bridge.send_status({"type": "reset"})
    bridge.free_memory_for(["cuda:0"])
    bridge.on_free_requested(lambda: None)
    bridge.on_memory_needed(lambda device: None)
    with pytest.raises(JobCancelled):
        bridge.raise_interrupted(JobCancelled("x"))


class FakeComfy:
    """Stand-ins for comfy.model_management and server.PromptServer with the calls ComfyUI's
    prompt loop makes (set_flag from POST /free, unload_all_models, free_memory)."""

    def __init__(self, free_bytes: float):
        import types

        self.free_bytes = free_bytes
        self.mm = types.ModuleType("comfy.model_management")
        self.mm.unload_all_models = lambda: self.mm.free_memory(1e30, torch.device("cuda", 0))
        self.mm.free_memory = lambda memory_required, device, keep_loaded=(): []
        self.mm.get_free_memory = lambda device: self.free_bytes
        queue = types.SimpleNamespace(flags={})
        queue.set_flag = lambda name, data: queue.flags.__setitem__(name, data)
        self.server = types.ModuleType("server")
        self.server.PromptServer = types.SimpleNamespace(instance=types.SimpleNamespace(prompt_queue=queue))
        self.queue = queue

    def install(self, monkeypatch) -> None:
        import types

        comfy = types.ModuleType("comfy")
        comfy.model_management = self.mm
        monkeypatch.setitem(sys.modules, "comfy", comfy)
        monkeypatch.setitem(sys.modules, "comfy.model_management", self.mm)
        monkeypatch.setitem(sys.modules, "server", self.server)


def test_workers_are_freed_when_the_user_frees_memory_not_on_every_unload(monkeypatch):
    comfy = FakeComfy(free_bytes=0)
    comfy.install(monkeypatch)
    freed = []
    ComfyBridge().on_free_requested(lambda: freed.append("all"))
    comfy.mm.unload_all_models()  # after a prompt under --disable-smart-memory, or after an OOM
    assert freed == []
    comfy.queue.set_flag("unload_models", True)  # POST /free {"unload_models": true}
    comfy.mm.unload_all_models()  # ComfyUI's prompt loop, right after reading the flags
    assert freed == ["all"]
    comfy.mm.unload_all_models()
    assert freed == ["all"]
    comfy.queue.set_flag("free_memory", True)
    comfy.mm.unload_all_models()
    assert freed == ["all", "all"] and comfy.queue.flags == {"unload_models": True, "free_memory": True}


class PromptLoop:
    """ComfyUI 0.3.64's prompt queue and loop as far as freeing goes (execution.PromptQueue's get,
    set_flag and get_flags; main.py's prompt_worker): the queue wait does not look at the flags, and
    the loop reads them only after the wait returns, collecting garbage before it waits again."""

    def __init__(self, mm, wait_s: float):
        self.mm, self.wait_s = mm, wait_s
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.flags: dict = {}
        self.collecting, self.collected = threading.Event(), threading.Event()

    def set_flag(self, name, data):
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self):
        with self.mutex:
            flags, self.flags = self.flags, {}
            return flags

    def get(self, timeout):
        with self.not_empty:
            self.not_empty.wait(timeout=timeout)  # no prompt is ever queued here
            return None

    def after_a_prompt(self):
        """One turn of prompt_worker after a prompt: flags, gc.collect(), wait, flags."""
        for turn in range(2):
            flags = self.get_flags()
            if flags.get("unload_models", flags.get("free_memory", False)):
                self.mm.unload_all_models()
            if turn == 0:
                self.collecting.set()
                self.collected.wait(10)  # gc.collect() (seconds on a loaded host)
                self.get(self.wait_s)


def test_free_lands_while_comfyuis_prompt_loop_collects_garbage(monkeypatch):
    """POST /free between the loop's flag read and its next wait: the notify is lost, and ComfyUI
    alone would free nothing until the next prompt (or its 1000 s wait ends)."""
    comfy = FakeComfy(free_bytes=0)
    loop = PromptLoop(comfy.mm, wait_s=60.0)
    comfy.server.PromptServer.instance.prompt_queue = loop
    comfy.install(monkeypatch)
    freed = threading.Event()
    ComfyBridge().on_free_requested(freed.set)
    worker = threading.Thread(target=loop.after_a_prompt, daemon=True)
    worker.start()
    assert loop.collecting.wait(10)
    loop.set_flag("unload_models", True)  # the route's call, while the loop collects garbage
    loop.collected.set()
    assert freed.wait(10), "the free request waited for the next prompt"
    worker.join(10)
    assert not worker.is_alive() and loop.flags == {}


def test_workers_on_a_gpu_are_freed_when_comfyui_needs_its_memory(monkeypatch):
    comfy = FakeComfy(free_bytes=2e9)
    comfy.install(monkeypatch)
    needed = []
    ComfyBridge().on_memory_needed(needed.append)
    comfy.mm.free_memory(1e9, torch.device("cuda", 1))  # enough is free
    comfy.mm.free_memory(3e9, torch.device("cpu"))  # not a GPU
    comfy.mm.unload_all_models()  # "unload everything" (also what we ask before starting workers)
    assert needed == []
    comfy.mm.free_memory(3e9, torch.device("cuda", 1))  # ComfyUI's own model does not fit next to ours
    assert needed == ["cuda:1"]


def test_context_frees_only_the_pools_on_the_needed_gpu():
    class Pool:
        def __init__(self, devices):
            self.devices, self.closed = devices, False

        def close(self):
            self.closed = True

    pools = [Pool(["cuda:0", "cuda:1"]), Pool(["cuda:2", "cuda:3"])]
    registry = type("Registry", (), {"pools": lambda self: list(pools)})()
    ctx = NodeContext.create(registry=registry, bridge=RecordingBridge())
    ctx.status.pool_loaded("a", "m", "flux", ["cuda:0", "cuda:1"], "ulysses=2", "")
    ctx.status.pool_loaded("b", "m", "flux", ["cuda:2", "cuda:3"], "ulysses=2", "")
    ctx.unload_device("cuda:1")
    assert [p.closed for p in pools] == [True, False]
    assert [p["pool"] for p in ctx.status.snapshot()["pools"]] == ["b"]


def test_conditioning_round_trip_and_entry_options():
    expected = {"embed_dim": 32, "pooled_dim": 32}
    (entry,) = to_branch(flux_cond(guidance=2.5), expected, "flux")
    cond = entry.cond
    assert cond.prompt_embeds.shape == (1, 7, 32) and cond.pooled.shape == (1, 32)
    assert (entry.guidance, entry.strength, entry.start_percent, entry.end_percent) == (2.5, 1.0, None, None)
    combined = flux_cond() + flux_cond(strength=0.5, start_percent=0.2, end_percent=0.8)  # Combine + options
    first, second = to_branch(combined, expected, "flux")
    assert first.is_plain and first.guidance is None
    assert (second.strength, second.start_percent, second.end_percent) == (0.5, 0.2, 0.8)
    back = from_runtime(cond)
    assert torch.equal(back[0][0], cond.prompt_embeds) and torch.equal(back[0][1]["pooled_output"], cond.pooled)


@pytest.mark.parametrize(
    ("conditioning", "match"),
    [
        (flux_cond(width=2048, pooled=1280), "SDXL conditioning given to a Flux model"),
        (flux_cond(width=768, pooled=768), "SD1.x conditioning given to a Flux model"),
        (flux_cond(pooled=None), "has no pooled_output"),
        (flux_cond(pooled=2048), "pooled output is 2048 wide"),
        (flux_cond(area=(8, 8, 0, 0)), "carries an area"),
        (flux_cond() + flux_cond(mask=torch.ones(1, 8, 8)), "positive entry 2 of 2 conditioning carries a mask"),
        (flux_cond(control=object()), "carries a ControlNet"),
        ("not conditioning", "is not a CONDITIONING"),
    ],
)
def test_conditioning_errors_say_what_why_fix(conditioning, match):
    with pytest.raises(ConfigError, match=match) as err:
        to_branch(conditioning, {"embed_dim": 32, "pooled_dim": 32}, "flux")
    assert "why:" in str(err.value) and "fix:" in str(err.value)


def test_prepare_latent_checks():
    zeros4 = {"samples": torch.zeros(1, 4, 8, 8)}
    assert prepare_latent(zeros4, 16, "flux").shape == (1, 16, 8, 8)  # empty latent of another family: fixed
    with pytest.raises(ConfigError, match="has 4 channels but this flux model works with 16"):
        prepare_latent({"samples": torch.ones(1, 4, 8, 8)}, 16, "flux")
    assert prepare_latent({"samples": torch.ones(1, 16, 9, 7)}, 16, "flux").shape == (1, 16, 9, 7)  # model pads
    with pytest.raises(ConfigError, match="noise mask"):
        prepare_latent({"samples": torch.zeros(1, 16, 8, 8), "noise_mask": torch.ones(1, 8, 8)}, 16, "flux")


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
    assert len(bridge.previews) == 4 and bridge.previews[0] == ("flux", (1, 16, 4, 4))
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
    with pytest.raises(ConfigError, match="has 4 channels but this flux VAE expects 16"):
        ParallelVAEDecode(fake_ctx).decode(handle, {"samples": torch.zeros(1, 4, 4, 4)})


def test_unload_node(fake_ctx):
    handle = fake_handle(fake_ctx)
    handle.model()
    result = ParallelRuntimeUnload(fake_ctx).unload(parallel_model=handle)
    assert handle.fake.unloaded and "unloaded" in result["ui"]["text"][0]
    assert fake_ctx.bridge.status[-1] == {"type": "pool_closed", "pool": handle.pool_id}


def test_validate_inputs():
    v = ParallelModelLoader.VALIDATE_INPUTS
    assert list(inspect.signature(v).parameters) == ["devices"]  # ComfyUI reports a problem once per name
    assert v("cpu:2") is True
    assert "no devices were given" in v(" ") or "no CUDA GPU" in v(" ")
    assert "no CUDA GPU is visible" in v("all")
    assert "unknown device" in v("gpu0")
    assert "only 0 CUDA GPU(s) are visible" in v("cuda:0,cuda:1")
    layout = dict(ulysses=2, ring=1, cfg=1, pipefusion=1, pp_patches=0)
    assert manual_layout(["cpu", "cpu"], **layout).ulysses == 2
    with pytest.raises(ConfigError, match="needs 4 ranks but 2 device"):
        manual_layout(["cpu", "cpu"], **{**layout, "ring": 2})
    with pytest.raises(ConfigError, match="cfg_parallel is 3"):
        manual_layout(["cpu", "cpu"], **{**layout, "cfg": 3})
    with pytest.raises(ConfigError, match="pp_patches 1 is fewer than the 2 PipeFusion stages"):
        manual_layout(["cpu", "cpu"], **{**layout, "ulysses": 1, "pipefusion": 2, "pp_patches": 1})
    e = ParallelEmptyLatent.VALIDATE_INPUTS
    assert e(1024, 768) is True
    assert e(1000, 768) is True  # a multiple of 8, as ComfyUI's EmptyLatentImage
    assert "width 1001 is not a multiple of 8" in e(1001, 768)
    s = ParallelSampler.VALIDATE_INPUTS
    assert s(20, 1.0) is True and "leaves no step" in s(20, 0.01)


def test_loader_errors_before_starting_workers(tmp_path):
    bridge = RecordingBridge(folders={"diffusers": [str(tmp_path)], "diffusion_models": [str(tmp_path)]})
    ctx = NodeContext.create(registry=object(), bridge=bridge)
    loader = ParallelModelLoader(ctx)
    args = dict(family="auto", layout="auto", **LOAD)
    with pytest.raises(ConfigError, match="model 'FLUX.1-dev' was not found") as err:
        loader.load(model="FLUX.1-dev", **args)
    assert str(tmp_path) in str(err.value)
    (tmp_path / "broken").mkdir()
    with pytest.raises(ConfigError, match="transformer/config.json"):
        loader.load(model="broken", **args)
    f = tmp_path / "sd3.safetensors"
    _write_safetensors(f, ["joint_blocks.0.x_block.attn.qkv.weight"])
    with pytest.raises(ConfigError, match="is a sd3 transformer but family 'flux' was chosen"):
        loader.load(model="sd3.safetensors", **{**args, "family": "flux"})
    with pytest.raises(ConfigError, match="no devices were given"):
        loader.load(model="tiny-flux", **{**args, "devices": ","})
    # The VAE input is checked before any worker starts too.
    (tmp_path / "vae").mkdir()
    bridge.folders["vae"] = [str(tmp_path / "vae")]
    _write_safetensors(tmp_path / "vae" / "clip_l.safetensors", ["text_model.final_layer_norm.weight"])
    with pytest.raises(ConfigError, match="clip_l.safetensors holds no VAE"):
        loader.load(model="tiny-flux", vae="clip_l.safetensors", **args)
    with pytest.raises(ConfigError, match="VAE 'ae.safetensors' was not found"):
        loader.load(model="tiny-flux", vae="ae.safetensors", **args)
    assert bridge.freed == []  # nothing was started


def _write_safetensors(path, names):
    import json
    import struct

    header = {
        n: {"dtype": "BF16", "shape": [8, 4], "data_offsets": [i * 64, (i + 1) * 64]} for i, n in enumerate(names)
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64 * len(names))


def test_model_choices_list_folders_and_files(tmp_path):
    from dit_parallel_pack.nodes.model_files import model_choices, resolve_model

    (tmp_path / "diffusers" / "FLUX.1-dev" / "transformer").mkdir(parents=True)
    (tmp_path / "diffusers" / "FLUX.1-dev" / "model_index.json").write_text("{}")
    (tmp_path / "unet").mkdir()
    (tmp_path / "unet" / "flux1-dev.safetensors").write_bytes(b"")
    bridge = RecordingBridge(
        folders={"diffusers": [str(tmp_path / "diffusers")], "diffusion_models": [str(tmp_path / "unet")]}
    )
    tiny = ["tiny-flux-shapes", "tiny-flux", "tiny-sd3", "tiny-pixart", "tiny-qwen-image", "tiny-flux2"]
    tiny += ["tiny-wan", "tiny-wan-i2v", "tiny-wan-a14b", "tiny-wan-ti2v"]
    assert model_choices(bridge) == ["FLUX.1-dev", "flux1-dev.safetensors", *tiny]
    assert resolve_model("flux1-dev.safetensors", bridge) == str(tmp_path / "unet" / "flux1-dev.safetensors")


def test_model_choices_survive_symlink_cycles(tmp_path):
    """Two links back up the tree used to make the listing walk for ever (2^depth paths)."""
    from dit_parallel_pack.nodes.model_files import model_choices

    model = tmp_path / "diffusers" / "linked" / "FLUX.1-dev"
    model.mkdir(parents=True)
    (model / "model_index.json").write_text("{}")
    (tmp_path / "diffusers" / "linked" / "up").symlink_to("..")
    (tmp_path / "diffusers" / "linked" / "again").symlink_to("..")
    bridge = RecordingBridge(folders={"diffusers": [str(tmp_path / "diffusers")]})
    t0 = time.monotonic()
    assert model_choices(bridge)[0] == "linked/FLUX.1-dev"
    assert time.monotonic() - t0 < 2.0


def test_vae_choices_and_resolution(tmp_path):
    from dit_parallel_pack.nodes.model_files import VAE_FROM_MODEL, resolve_vae, vae_choices

    (tmp_path / "vae" / "flux").mkdir(parents=True)
    (tmp_path / "vae" / "flux" / "ae.safetensors").write_bytes(b"")
    (tmp_path / "vae" / "notes.txt").write_text("not a VAE")
    bridge = RecordingBridge(folders={"vae": [str(tmp_path / "vae")]})
    assert vae_choices(bridge) == [VAE_FROM_MODEL, "flux/ae.safetensors"]
    assert resolve_vae(VAE_FROM_MODEL, bridge) is None
    assert resolve_vae("flux/ae.safetensors", bridge) == str(tmp_path / "vae" / "flux" / "ae.safetensors")
    with pytest.raises(ConfigError, match="VAE 'sdxl_vae.safetensors' was not found"):
        resolve_vae("sdxl_vae.safetensors", bridge)


# -- part 2: end to end on the tiny families with the real runtime ----------------------------------
@pytest.fixture(scope="module")
def real_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=RecordingBridge())


def api():
    from parallel_runtime.service import api as service_api

    return service_api


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
