"""HunyuanVideo 1.5's VAE from a single file in Tencent's layout (Comfy-Org's hunyuanvideo15_vae_fp16.safetensors in
models/vae). The tiny folder's VAE is written in Tencent's names (the test's own inverse table, after diffusers'
convert_hunyuan_video1_5_to_diffusers.py); read back, it holds the folder's tensors and config, and its decode on one
device, band-parallel over two ranks and through the loader's ``vae`` input and the decode job equals the folder's VAE decode. A file that is not this VAE is refused."""

from __future__ import annotations

import re

import pytest
import torch

from dit_devtools.tiny import ensure_tiny_model
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.loading import load_pipeline_components
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import ParallelMesh
from parallel_runtime.service.load_job import load_model
from parallel_runtime.service.model_jobs import decode
from parallel_runtime.vae.decode import decode_latent, decode_to_image_tensor
from parallel_runtime.vae.file import inspect_vae_file, load_vae_file
from tests.dist_jobs import hunyuan_video_jobs

NAME = "tiny-hunyuan-video-1.5"
TENCENT = (  # diffusers' piece -> Tencent's (one rename per name)
    (r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample."),
    (r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", r"encoder.down.\1.block.\2."),
    (r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", r"decoder.up.\1.upsample."),
    (r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.", r"decoder.up.\1.block.\2."),
    (r"(\w+)\.mid_block\.resnets\.(\d)\.", lambda m: f"{m[1]}.mid.block_{int(m[2]) + 1}."),
    (r"(\w+)\.mid_block\.attentions\.0\.to_([qkv])\.", r"\1.mid.attn_1.\2."),
    (r"(\w+)\.mid_block\.attentions\.0\.", r"\1.mid.attn_1."),
)


def tencent_name(name: str) -> str:
    for pattern, repl in TENCENT:
        renamed, n = re.subn("^" + pattern, repl, name)
        if n:
            return renamed
    return name  # conv_in / conv_out / norm_out keep their names


@pytest.fixture(scope="module")
def folder_vae():
    return load_pipeline_components(ensure_tiny_model(NAME), "cpu", torch.float32, parts=("vae",)).vae


@pytest.fixture(scope="module")
def vae_path(folder_vae, tmp_path_factory):
    from safetensors.torch import save_file

    state = {tencent_name(k): v.contiguous() for k, v in folder_vae.state_dict().items()}
    assert len(state) == len(folder_vae.state_dict()) and not any("_blocks." in k for k in state)
    path = tmp_path_factory.mktemp("hv15-vae") / "hunyuanvideo15_vae_fp16.safetensors"
    save_file(state, str(path))
    return path


def test_the_file_loads_to_the_folders_vae(folder_vae, vae_path):
    info = inspect_vae_file(vae_path)
    assert (info.layout, info.prefix) == ("hunyuan-video-1.5", "")
    vae = load_vae_file(vae_path)
    assert type(vae).__name__ == "AutoencoderKLHunyuanVideo15"
    ours, theirs = vae.state_dict(), folder_vae.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    for key in ("in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
                "spatial_compression_ratio", "temporal_compression_ratio", "scaling_factor"):  # fmt: skip
        mine, folder = vae.config[key], folder_vae.config[key]
        assert (list(mine) if isinstance(mine, (list, tuple)) else mine) == (
            list(folder) if isinstance(folder, (list, tuple)) else folder
        ), key


@torch.no_grad()
def test_decode_equals_the_folders_vae_on_one_device_and_two_ranks(cpu_pool, folder_vae, vae_path):
    vae = load_vae_file(vae_path)
    z = torch.randn(1, 8, 3, 4, 2, generator=torch.Generator().manual_seed(3))
    single = ParallelMesh.single()
    assert torch.equal(decode_latent(vae, z, single, None), decode_latent(folder_vae, z, single, None))
    one = decode_to_image_tensor(folder_vae, z, single, None)
    job = hunyuan_video_jobs.decode_video
    outs = cpu_pool(ParallelConfig(ulysses=2)).submit(job, str(vae_path), z, 1, result_rank="all").result(300)
    torch.testing.assert_close(outs[0]["image"], one, atol=2e-5, rtol=0)
    assert outs[1]["image"] is None
    assert all(out["sent"].get("video_vae_halo", 0) > 0 for out in outs)  # the rows were split over the ranks


@torch.no_grad()
def test_parallel_vae_decode_with_the_file_picked_in_the_loader(cpu_pool, folder_vae, vae_path):
    """The loader's ``vae`` input: the folder's model with this file as its VAE, decoded by the decode job on two
    ranks, equals the folder's VAE decode (as ComfyUI IMAGE frames)."""
    z = torch.randn(1, 8, 2, 3, 2, generator=torch.Generator().manual_seed(4))
    pool = cpu_pool(ParallelConfig(ulysses=2))
    pool.submit(load_model, str(ensure_tiny_model(NAME)), "fp32", "sdpa", vae_path=str(vae_path)).result(300)
    image = pool.submit(decode, z).result(300)
    own = folder_vae.decode(z).sample
    assert image.shape == (5, 48, 32, 3)
    torch.testing.assert_close(image, ((own + 1) / 2).clamp(0, 1)[0].movedim(0, -1), atol=2e-5, rtol=0)


def test_a_file_that_is_not_this_vae_is_refused(vae_path, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(str(vae_path))
    extra = tmp_path / "extra.safetensors"
    save_file({**state, "decoder.mid.attn_2.q.weight": torch.zeros(1)}, str(extra))
    with pytest.raises(ConfigError, match="unknown tensor 'decoder.mid.attn_2.q.weight'.*HunyuanVideo 1.5"):
        load_vae_file(extra)
    partial = tmp_path / "partial.safetensors"
    save_file({k: v for k, v in state.items() if not k.startswith("encoder.mid.attn_1.")}, str(partial))
    with pytest.raises(ConfigError, match="does not fit a HunyuanVideo 1.5 VAE: missing"):
        load_vae_file(partial)
    one_level = tmp_path / "one_level.safetensors"
    save_file({k: v for k, v in state.items() if not re.match(r"decoder\.up\.[1-9]", k)}, str(one_level))
    with pytest.raises(ConfigError, match="HunyuanVideo 1.5 VAE with 1 decoder levels"):
        inspect_vae_file(one_level)
