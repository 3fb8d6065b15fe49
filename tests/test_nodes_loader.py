"""The Parallel Model Loader's side of a graph without workers: input validation, errors before any worker
starts, and the model and VAE choices it lists from ComfyUI's folders."""

from __future__ import annotations

import inspect
import time

import pytest
from node_helpers import LOAD, RecordingBridge  # tests/ helpers
from pack_import import load_pack

from parallel_runtime.errors import ConfigError
from parallel_runtime.service.load_plan import manual_layout

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402


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
    with pytest.raises(ConfigError, match="cfg_parallel=3 is out of range"):
        manual_layout(["cpu", "cpu"], **{**layout, "cfg": 3})
    with pytest.raises(ConfigError, match="pp_patches 1 is fewer than the 2 PipeFusion stages"):
        manual_layout(["cpu", "cpu"], **{**layout, "ulysses": 1, "pipefusion": 2, "pp_patches": 1})
    e = ParallelEmptyLatent.VALIDATE_INPUTS
    assert e(1024, 768) is True
    assert e(1000, 768) is True  # a multiple of 8, as ComfyUI's EmptyLatentImage
    assert "width 1001 is not a multiple of 8" in e(1001, 768)
    s = ParallelSampler.VALIDATE_INPUTS
    assert s(20, 1.0) is True
    assert s(20, 0.01) is True  # KSampler runs 20 steps of a 2000-step schedule
    assert "steps=10001 is out of range" in s(10001, 1.0) and "denoise=1.5" in s(20, 1.5)
    assert s(10000, 0.01) is True  # ComfyUI's extreme passes
    assert "schedule of 1e+08 sigmas" in s(10000, 0.0001)


def test_loader_errors_before_starting_workers(tmp_path):
    bridge = RecordingBridge(folders={"diffusers": [str(tmp_path)], "diffusion_models": [str(tmp_path)]})
    ctx = NodeContext.create(registry=object(), bridge=bridge)
    loader = ParallelModelLoader(ctx)
    args = dict(family="auto", layout="auto", **LOAD)
    with pytest.raises(ConfigError, match="model 'FLUX.1-dev' was not found") as err:
        loader.load(model="FLUX.1-dev", **args)
    assert str(tmp_path) in str(err.value)
    (tmp_path / "broken").mkdir()
    with pytest.raises(ConfigError, match="broken has no model_index.json"):
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
    from parallel_runtime.models.builtin import BUILTIN_MODELS  # the shipped one first, then a family's each

    assert BUILTIN_MODELS[0] == "tiny-flux-shapes" and len(BUILTIN_MODELS) >= 13  # HunyuanVideo's too
    assert model_choices(bridge) == ["FLUX.1-dev", "flux1-dev.safetensors", *BUILTIN_MODELS]
    assert resolve_model("flux1-dev.safetensors", bridge) == str(tmp_path / "unet" / "flux1-dev.safetensors")


def test_checkpoints_are_listed_after_transformer_files_and_resolved_second(tmp_path):
    """Full checkpoints in models/checkpoints (.safetensors / .sft, never pickles) follow the diffusion_models
    files; a name both folders hold loads the diffusion_models file (as saved workflows did) and the checkpoint
    is offered as "[checkpoints] <name>"; the not-found message names the checkpoints folders searched."""
    from dit_parallel_pack.nodes.model_files import CHECKPOINT_TAG, model_choices, resolve_model

    from parallel_runtime.models.builtin import BUILTIN_MODELS

    unet, ckpts = tmp_path / "diffusion_models", tmp_path / "checkpoints"
    (ckpts / "ltx").mkdir(parents=True)
    unet.mkdir()
    for name in ("flux1-dev.safetensors", "sd3.5_large.safetensors"):
        (unet / name).write_bytes(b"")
    for name in ("ltx/ltx-2-19b-dev.safetensors", "sd3.5_large.safetensors", "chroma.sft", "v1-5.ckpt", "a.gguf"):
        (ckpts / name).write_bytes(b"")
    bridge = RecordingBridge(folders={"diffusion_models": [str(unet)], "checkpoints": [str(ckpts)]})
    assert CHECKPOINT_TAG == "[checkpoints] "
    assert model_choices(bridge) == [
        "flux1-dev.safetensors",
        "sd3.5_large.safetensors",
        "chroma.sft",
        "ltx/ltx-2-19b-dev.safetensors",
        "[checkpoints] sd3.5_large.safetensors",
        *BUILTIN_MODELS,
    ]
    assert resolve_model("ltx/ltx-2-19b-dev.safetensors", bridge) == str(ckpts / "ltx" / "ltx-2-19b-dev.safetensors")
    assert resolve_model("chroma.sft", bridge) == str(ckpts / "chroma.sft")
    assert resolve_model("sd3.5_large.safetensors", bridge) == str(unet / "sd3.5_large.safetensors")
    assert resolve_model("[checkpoints] sd3.5_large.safetensors", bridge) == str(ckpts / "sd3.5_large.safetensors")
    (unet / "sd3.5_large.safetensors").unlink()  # the plain name falls through to the checkpoint
    assert resolve_model("sd3.5_large.safetensors", bridge) == str(ckpts / "sd3.5_large.safetensors")
    assert "sd3.5_large.safetensors" in model_choices(bridge)
    for missing in ("v1-5.ckpt", "a.gguf", "[checkpoints] flux1-dev.safetensors"):  # pickles / GGUF: not here
        with pytest.raises(ConfigError, match="models/checkpoints") as err:
            resolve_model(missing, bridge)
        assert str(ckpts) in str(err.value)


def test_loader_reads_a_checkpoint_from_models_checkpoints(tmp_path):
    """The node resolves a prefixed full checkpoint in models/checkpoints and reads it (its family is detected
    from the model.diffusion_model. names) before any worker starts."""
    (tmp_path / "checkpoints").mkdir()
    _write_safetensors(
        tmp_path / "checkpoints" / "sd3.5_large_fp8_scaled.safetensors",
        ["model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight", "first_stage_model.decoder.conv_in.weight"],
    )
    bridge = RecordingBridge(folders={"checkpoints": [str(tmp_path / "checkpoints")]})
    loader = ParallelModelLoader(NodeContext.create(registry=object(), bridge=bridge))
    with pytest.raises(ConfigError, match="is a sd3 transformer but family 'flux' was chosen"):
        loader.load(model="sd3.5_large_fp8_scaled.safetensors", family="flux", layout="auto", **LOAD)
    assert bridge.freed == []


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
