"""The LTX-Video 0.9.0 VAE of a checkpoint in Lightricks' layout decodes as ComfyUI's VAE Decode: its decoder pads in
space with reflect unless the checkpoint's ``config`` metadata states a ``spatial_padding_mode`` (diffusers' decoder
pads with zeros: the pictures differ at the borders).

Oracles: ComfyUI's own decode of the same tiny checkpoint, stating no padding and stating zeros
(tests/data/make_comfy_ltx_video_vae_reference.py --release 0.9.0), and the single-device decode for 2 worker
processes (band halos and the clip's border mirrored as one picture's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from parallel_runtime.models.families.ltx_video import vae_file
from parallel_runtime.models.families.ltx_video.vae_file_later import PADDING, pad_decoder
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.vae.decode import decode_to_image_tensor
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file
from tests.dist_jobs import ltx_vae_jobs

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
from ltx_video_vae090_tiny_weights import checkpoint_metadata, tiny_ltx_vae090_state_dict  # noqa: E402
from wan_tiny_weights import hashed_uniform, state_digest  # noqa: E402

REF = json.loads((DATA / "comfy_ltx_video_vae090_reference.json").read_text())
COMFY_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny 0.9.0 VAE (with its encoder, which ComfyUI was not given) in a checkpoint stating no padding."""
    from safetensors.torch import save_file

    state = tiny_ltx_vae090_state_dict()
    decoder = {k: v for k, v in state.items() if not k.startswith("encoder.")}
    assert state_digest({k: v.reshape(-1) for k, v in decoder.items()}) == REF["decoder_digest"]
    path = tmp_path_factory.mktemp("ltx-vae090") / "ltx-video-tiny-v0.9.safetensors"
    save_file({"vae." + k: v.contiguous() for k, v in state.items()}, str(path), metadata=checkpoint_metadata())
    del state, decoder
    return path


@pytest.fixture(scope="module")
def vae(checkpoint):
    return load_vae_file(checkpoint)


def latent() -> torch.Tensor:
    recipe = REF["latent"]
    z = hashed_uniform(recipe["name"], tuple(recipe["shape"]), recipe["scale"])
    assert state_digest({"t": z}) == recipe["digest"]
    return z


def strided(image: torch.Tensor, stated: str) -> tuple[torch.Tensor, torch.Tensor]:
    ref = REF[stated]["image"]
    assert list(image.shape) == ref["shape"]
    return image.float().flatten()[:: ref["stride"]], torch.tensor(ref["data"], dtype=torch.float32)


def test_decode_pads_as_comfyui_as_the_metadata_states(vae, checkpoint):
    """No padding stated: reflect, as ComfyUI (not diffusers' zeros); zeros stated: zeros, as ComfyUI."""
    assert (REF["stated_none"]["padding_mode"], REF["stated_zeros"]["padding_mode"]) == ("reflect", "zeros")
    assert inspect_vae_file(checkpoint).config[PADDING] == "reflect"
    assert vae_file.FORMAT.metadata({PADDING: "reflect"}, {})[PADDING] == "reflect"  # no metadata (VAELoader)
    zeros = vae_file.FORMAT.metadata({PADDING: "reflect"}, checkpoint_metadata(spatial_padding_mode="zeros"))
    assert zeros[PADDING] == "zeros"
    z = latent()
    ours, theirs = strided(decode_to_image_tensor(vae, z, ParallelMesh.single(), None), "stated_none")
    assert (ours - theirs).abs().max().item() <= COMFY_TOLERANCE
    pad_decoder(vae, "zeros")
    try:
        zero_padded = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    finally:
        pad_decoder(vae, "reflect")
    ours_zeros, theirs_zeros = strided(zero_padded, "stated_zeros")
    assert (ours_zeros - theirs_zeros).abs().max().item() <= COMFY_TOLERANCE
    assert (theirs - theirs_zeros).abs().max() > 0.01  # the padding shows in ComfyUI's own pictures


def test_two_ranks_decode_as_one_and_as_comfyui(cpu_pool, vae, checkpoint):
    """Bands of one latent row on 2 worker processes, each reading the file: the single-device picture (reflect at
    the clip's border only, halos between bands) and ComfyUI's."""
    z = latent()
    expected = decode_to_image_tensor(vae, z, ParallelMesh.single(), None)
    pool = cpu_pool(ParallelConfig(ulysses=2))
    got = pool.submit(ltx_vae_jobs.decode_file, str(checkpoint), z, 0, min_band_rows=1).result(300)
    assert (got - expected).abs().max().item() <= 1e-5
    ours, theirs = strided(got, "stated_none")
    assert (ours - theirs).abs().max().item() <= COMFY_TOLERANCE
