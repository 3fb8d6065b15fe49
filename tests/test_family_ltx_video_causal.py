"""LTX-Video 0.9.5+ causal time positions, decided as ComfyUI 0.3.64 decides them: a tiny file whose safetensors
``config`` metadata sets ``causal_temporal_positioning`` (as Lightricks' releases do) equals ComfyUI's Load
Checkpoint + KSampler on it (stored by tests/data/make_comfy_ltx_video_causal_reference.py) to 1e-4, on one device
and on Ulysses 2 / PipeFusion 2 in worker processes; the same weights without the metadata equal ComfyUI's
0.9.0 positions (what UNETLoader gives on either file); a broken metadata entry is refused on the host."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.denoise import SamplingSettings, denoise_latent, model_sampling_for
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.ltx_video import CAUSAL_POSITIONS
from parallel_runtime.models.families.ltx_video.conditioning import LTXFrameRate
from parallel_runtime.models.single_file import inspect_single_file, load_single_file_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import generate

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_tiny_weights import TinyLTXVideo, tiny_ltx_video_state_dict  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_ltx_video_causal_reference.json").read_text())
TOLERANCE = 1e-4
PREFIX = "model.diffusion_model."
LAYOUTS = {"ulysses2": ParallelConfig(ulysses=2), "pp2": ParallelConfig(pp=2)}


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


def conditioning(recipe: dict) -> Conditioning:
    t5 = recipe["t5"]
    states = hashed_uniform(t5["name"], tuple(t5["shape"]), t5["scale"])
    assert state_digest({"t": states}) == t5["digest"], "the T5 states are not what the reference was made from"
    mask = torch.zeros(states.shape[:2])
    mask[:, : recipe["kept"]] = 1
    return Conditioning(states, None, mask, LTXFrameRate(torch.tensor([REF["sampling"]["frame_rate"]])))


def inputs():
    run = REF["sampling"]
    settings = SamplingSettings(
        seed=run["seed"], steps=run["steps"], cfg=run["cfg"], sampler=run["sampler"], scheduler=run["scheduler"]
    )
    return conditioning(REF["positive"]), conditioning(REF["negative"]), tensor(REF["latent"]), settings


def write(folder: Path, metadata: dict[str, str] | None) -> Path:
    from safetensors.torch import save_file

    info = REF["model"]
    state = tiny_ltx_video_state_dict(TinyLTXVideo(**info["config"]), info["salt"])
    assert state_digest(state) == info["digest"], "tiny LTX-Video weights differ from the reference's"
    path = folder / f"ltx_{len(list(folder.iterdir()))}.safetensors"
    save_file({PREFIX + k: v for k, v in state.items()}, str(path), metadata=metadata)
    return path


@pytest.fixture(scope="module")
def causal_file(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("ltx-causal"), REF["metadata"])


def error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    assert ours.shape == ref.shape
    return ((ours - ref).norm() / ref.norm()).item()


def sample_one_device(path: Path) -> torch.Tensor:
    adapter = load_single_file_components(path, "cpu", torch.float32).adapter()
    pos, neg, latent, settings = inputs()
    return denoise_latent(adapter, ParallelMesh.single(), model_sampling_for(adapter), pos, neg, latent, settings)


def test_metadata_causal_positions_equal_comfyui_load_checkpoint(causal_file):
    assert inspect_single_file(causal_file).config[CAUSAL_POSITIONS] is True
    out = sample_one_device(causal_file)
    assert error(out, tensor(REF["checkpoint_loader"]["output"])) <= TOLERANCE
    # the case tells the two position rules apart: ComfyUI's 0.9.0 positions give another video
    assert error(out, tensor(REF["unet_loader"]["output"])) > 100 * TOLERANCE


@pytest.mark.parametrize("metadata", [None, {"config": json.dumps({"transformer": {"num_layers": 2}})}])
def test_without_causal_metadata_the_0_9_0_positions_equal_comfyui(tmp_path, metadata):
    """No metadata, or metadata without the flag: ComfyUI's 0.9.0 positions (UNETLoader's result on the same
    weights, which reads no metadata)."""
    path = write(tmp_path, metadata)
    assert not inspect_single_file(path).config.get(CAUSAL_POSITIONS, False)
    assert error(sample_one_device(path), tensor(REF["unet_loader"]["output"])) <= TOLERANCE


@pytest.mark.parametrize(
    ("config", "words"),
    [("{not json", "not JSON"), (json.dumps({"transformer": {"causal_temporal_positioning": "yes"}}), "'yes'")],
)
def test_broken_metadata_is_refused_on_the_host(tmp_path, config, words):
    path = write(tmp_path, {"config": config})
    with pytest.raises(ConfigError, match=words):
        inspect_single_file(path)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layouts_equal_comfyui_load_checkpoint(cpu_pool, causal_file, layout):
    pool = cpu_pool(LAYOUTS[layout])
    pool.submit(load_model, str(causal_file), "fp32", "sdpa").result(300)
    pos, neg, latent, settings = inputs()
    kwargs = {"patches": 2, "warmup": settings.steps} if layout == "pp2" else {}
    out = pool.submit(generate, pos, neg, latent, settings, **kwargs).result(600)
    assert error(out, tensor(REF["checkpoint_loader"]["output"])) <= TOLERANCE
