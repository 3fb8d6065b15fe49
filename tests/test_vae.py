"""Parallel VAE decode: band-aware ops in one process, and the exact multi-rank decode in real
worker processes (gloo) against diffusers' own single-device ``vae.decode(z).sample``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from torch import nn

from parallel_runtime.errors import ConfigError
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.parallel.mesh import CommStats, ParallelMesh
from parallel_runtime.vae.bands import RowBands, plan_band_rows
from parallel_runtime.vae.decode import compute_dtype, decode_latent, decode_to_image_tensor
from parallel_runtime.vae.decoder import check_decoder, upsampling_factor
from parallel_runtime.vae.ops import band_attention, band_conv2d, band_group_norm, band_upsample_nearest2x
from tests.dist_jobs import vae_jobs

TOL = 1e-4


def tiny_vae(latent_channels: int, seed: int = 0) -> AutoencoderKL:
    """A tiny random AutoencoderKL: 3 up blocks (two 2x upsamplings), 4 GroupNorm groups, mid
    attention. 4 channels with quant convs (SD / PixArt style) or 16 without (SD3 / Flux style)."""
    torch.manual_seed(seed)
    sd_style = latent_channels == 4
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 16, 16),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=0.18215 if sd_style else 0.3611,
        shift_factor=None if sd_style else 0.1159,
        use_quant_conv=sd_style,
        use_post_quant_conv=sd_style,
        mid_block_add_attention=True,
    )
    # Random GroupNorm affine parameters too, so that they are exercised (defaults are 1 / 0).
    with torch.no_grad():
        for module in vae.modules():
            if isinstance(module, nn.GroupNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return vae.eval()


@pytest.fixture(scope="module")
def vae_dirs(tmp_path_factory) -> dict[int, str]:
    """Both tiny VAEs saved with save_pretrained (the workers load them from these folders)."""
    root = tmp_path_factory.mktemp("tiny_vaes")
    dirs = {}
    for channels in (4, 16):
        path = root / f"vae{channels}"
        tiny_vae(channels).save_pretrained(path)
        dirs[channels] = str(path)
    return dirs


def reference(vae_dir: str, z: torch.Tensor) -> torch.Tensor:
    """Single-device diffusers decode of the saved VAE."""
    vae = AutoencoderKL.from_pretrained(vae_dir).eval()
    with torch.no_grad():
        return vae.decode(z).sample


def single_layout(rows: int) -> RowBands:
    return RowBands(rows=(rows,), rank=0, group=None, stats=CommStats())


# -- single process: the band-aware ops equal the plain ops when the band is the whole image -----
def test_group_norm_equals_torch_groupnorm_with_large_mean():
    torch.manual_seed(1)
    norm = nn.GroupNorm(4, 16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1, 1)
    x = torch.randn(2, 16, 7, 9) * 3 + 200.0  # mean far from 0: a naive E[x^2]-E[x]^2 would lose digits
    torch.testing.assert_close(band_group_norm(x, norm, single_layout(7)), norm(x), atol=TOL, rtol=0)


def test_group_norm_without_affine_and_in_float16():
    norm = nn.GroupNorm(2, 8, affine=False)
    x = torch.randn(1, 8, 5, 6)
    torch.testing.assert_close(band_group_norm(x, norm, single_layout(5)), norm(x), atol=TOL, rtol=0)
    half = band_group_norm(x.half(), norm, single_layout(5))
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), norm(x), atol=5e-3, rtol=0)


@pytest.mark.parametrize(("kernel", "padding"), [(1, 0), (3, 1), (5, 2), ((3, 1), (1, 0))])
def test_conv_equals_torch_conv(kernel, padding):
    torch.manual_seed(2)
    conv = nn.Conv2d(6, 5, kernel, padding=padding)
    x = torch.randn(2, 6, 8, 7)
    torch.testing.assert_close(band_conv2d(x, conv, single_layout(8)), conv(x), atol=TOL, rtol=0)


def test_upsample_doubles_band_and_layout():
    x = torch.randn(1, 3, 4, 5)
    out, layout = band_upsample_nearest2x(x, RowBands((4, 3, 0), 0, None, CommStats()))
    torch.testing.assert_close(out, F.interpolate(x, scale_factor=2.0, mode="nearest"))
    assert layout.rows == (8, 6, 0) and layout.offset == 0 and layout.active == 2


def test_attention_equals_diffusers_attention():
    vae = tiny_vae(4)
    attn = vae.decoder.mid_block.attentions[0]
    x = torch.randn(2, 16, 5, 6)
    with torch.no_grad():
        torch.testing.assert_close(band_attention(x, attn, single_layout(5)), attn(x), atol=TOL, rtol=0)


def test_band_layout_neighbours():
    stats = CommStats()
    layouts = [RowBands((3, 2, 2, 0), r, None, stats) for r in range(4)]
    assert [(lay.up, lay.down) for lay in layouts] == [(None, 1), (0, 2), (1, None), (None, None)]
    assert [lay.offset for lay in layouts] == [0, 3, 5, 7]
    assert layouts[0].height == 7 and layouts[0].active == 3


@pytest.mark.parametrize(
    ("height", "ranks", "min_rows", "expected"),
    [
        (16, 2, 2, (8, 8)),
        (13, 4, 2, (4, 3, 3, 3)),
        (5, 4, 2, (3, 2, 0, 0)),
        (5, 4, 1, (2, 1, 1, 1)),
        (1, 4, 2, (1, 0, 0, 0)),
        (7, 1, 2, (7,)),
    ],
)
def test_plan_band_rows(height, ranks, min_rows, expected):
    assert plan_band_rows(height, ranks, min_rows) == expected


def test_plan_band_rows_rejects_nonsense():
    with pytest.raises(ConfigError, match="latent rows"):
        plan_band_rows(0, 2, 1)


def test_check_decoder_accepts_the_diffusers_variants_and_names_bad_layers():
    for channels in (4, 16):
        vae = tiny_vae(channels)
        assert check_decoder(vae) == 1
        assert upsampling_factor(vae) == 4
    vae = tiny_vae(4)
    vae.decoder.up_blocks[1].resnets[0].conv1.stride = (2, 2)
    with pytest.raises(ConfigError, match=r"up_blocks\.1\.resnets\.0\.conv1"):
        check_decoder(vae)
    with pytest.raises(ConfigError, match="training mode"):
        check_decoder(tiny_vae(4).train())


@pytest.mark.parametrize("channels", [4, 16])
def test_single_rank_decode_equals_diffusers(channels):
    vae = tiny_vae(channels)
    z = torch.randn(2, channels, 7, 5)
    with torch.no_grad():
        ref = vae.decode(z).sample
    out = decode_latent(vae, z, ParallelMesh.single())
    assert out.shape == ref.shape == (2, 3, 28, 20)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)


def test_mid_block_without_attention():
    torch.manual_seed(3)
    vae = AutoencoderKL(
        latent_channels=16,
        block_out_channels=(8, 16),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=4,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
    ).eval()
    z = torch.randn(1, 16, 6, 4)
    with torch.no_grad():
        ref = vae.decode(z).sample
    torch.testing.assert_close(decode_latent(vae, z, ParallelMesh.single()), ref, atol=TOL, rtol=0)


def test_float16_vae_is_upcast_when_config_forces_it():
    vae = tiny_vae(16).half()
    assert vae.config.force_upcast and compute_dtype(vae) == torch.float32
    assert compute_dtype(vae, upcast=False) == torch.float16
    z = torch.randn(1, 16, 6, 6)
    out = decode_latent(vae, z, ParallelMesh.single())
    assert out.dtype == torch.float32
    with torch.no_grad():
        ref = vae.float().decode(z).sample  # the same (fp16-rounded) weights, in float32
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)


def test_image_tensor_convention_single_rank():
    vae = tiny_vae(4)
    z = torch.randn(2, 4, 4, 6)
    image = decode_to_image_tensor(vae, z, ParallelMesh.single())
    with torch.no_grad():
        ref = (vae.decode(z).sample / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
    assert image.shape == (2, 16, 24, 3) and image.dtype == torch.float32
    torch.testing.assert_close(image, ref, atol=TOL, rtol=0)


def test_bad_inputs_say_what_to_do():
    vae = tiny_vae(4)
    with pytest.raises(ConfigError, match="4 channels"):
        decode_latent(vae, torch.randn(1, 16, 4, 4), ParallelMesh.single())
    with pytest.raises(ConfigError, match="min_band_rows"):
        decode_latent(vae, torch.randn(1, 4, 4, 4), ParallelMesh.single(), min_band_rows=0)
    with pytest.raises(ConfigError, match="unknown mesh dimension"):
        decode_latent(vae, torch.randn(1, 4, 4, 4), ParallelMesh.single(), "rows")
    with pytest.raises(ConfigError, match="result_rank"):
        decode_latent(vae, torch.randn(1, 4, 4, 4), ParallelMesh.single(), result_rank=1)


# -- real worker processes: exact against diffusers' single-device decode ------------------------
LAYOUTS = {
    "ulysses2": ParallelConfig(ulysses=2),
    "ulysses4": ParallelConfig(ulysses=4),
    "ring2xulysses2": ParallelConfig(ring=2, ulysses=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("channels", [4, 16])
@pytest.mark.parametrize("size", [(16, 16), (13, 18), (5, 34)], ids=["16x16", "13x18", "5x34"])
def test_parallel_decode_equals_single_device(cpu_pool, vae_dirs, layout, channels, size):
    config = LAYOUTS[layout]
    z = torch.randn(2, channels, *size, generator=torch.Generator().manual_seed(sum(size) + channels))
    ref = reference(vae_dirs[channels], z)
    outs = cpu_pool(config).submit(vae_jobs.decode_band, vae_dirs[channels], z, result_rank="all").result(timeout=300)
    image = outs[0]["image"]
    assert image.shape == ref.shape
    torch.testing.assert_close(image, ref, atol=TOL, rtol=0)
    # Only the result rank (sp rank 0) assembles the image; every rank decoded a band.
    assert all(out["image"] is None for out in outs[1:])
    active = plan_band_rows(size[0], config.sp_degree, 2)
    for rank, out in enumerate(outs):
        assert (out["sent"].get("halo", 0) > 0) == (active[rank] > 0 and config.sp_degree > 1)
        assert out["sent"].get("groupnorm", 0) > 0  # ranks sitting out still join the statistics


def test_thin_latent_sits_ranks_out_and_one_row_bands_are_exact(cpu_pool, vae_dirs):
    pool = cpu_pool(LAYOUTS["ulysses4"])
    z = torch.randn(2, 16, 5, 34, generator=torch.Generator().manual_seed(7))
    ref = reference(vae_dirs[16], z)
    # Default: at least 2 latent rows per band, so only ranks 0 and 1 decode (3 + 2 rows).
    outs = pool.submit(vae_jobs.decode_band, vae_dirs[16], z, result_rank="all").result(timeout=300)
    assert [out["sent"].get("halo", 0) > 0 for out in outs] == [True, True, False, False]
    torch.testing.assert_close(outs[0]["image"], ref, atol=TOL, rtol=0)
    # min_band_rows=1: four bands of 2, 1, 1, 1 rows (1-row bands take both halos from neighbours).
    outs = pool.submit(vae_jobs.decode_band, vae_dirs[16], z, result_rank="all", min_band_rows=1).result(timeout=300)
    assert all(out["sent"].get("halo", 0) > 0 for out in outs)
    torch.testing.assert_close(outs[0]["image"], ref, atol=TOL, rtol=0)
    # A 1-row latent: rank 0 decodes alone, the others sit out without deadlock.
    z1 = z[:, :, :1]
    image = pool.submit(vae_jobs.decode_band, vae_dirs[16], z1, result_rank=0).result(timeout=300)["image"]
    torch.testing.assert_close(image, reference(vae_dirs[16], z1), atol=TOL, rtol=0)


def test_result_on_another_rank_and_on_all(cpu_pool, vae_dirs):
    pool = cpu_pool(LAYOUTS["ulysses2"])
    z = torch.randn(1, 4, 9, 7, generator=torch.Generator().manual_seed(11))
    ref = reference(vae_dirs[4], z)
    outs = pool.submit(vae_jobs.decode_band, vae_dirs[4], z, image_rank=1, result_rank="all").result(timeout=300)
    assert outs[0]["image"] is None
    torch.testing.assert_close(outs[1]["image"], ref, atol=TOL, rtol=0)
    outs = pool.submit(vae_jobs.decode_band, vae_dirs[4], z, image_rank="all", result_rank="all").result(timeout=300)
    for out in outs:
        torch.testing.assert_close(out["image"], ref, atol=TOL, rtol=0)


def test_parallel_image_tensor_convention(cpu_pool, vae_dirs):
    z = torch.randn(2, 16, 6, 5, generator=torch.Generator().manual_seed(5))
    ref = (reference(vae_dirs[16], z) / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
    image = cpu_pool(LAYOUTS["ulysses2"]).submit(vae_jobs.decode_image, vae_dirs[16], z).result(timeout=300)
    assert image.shape == (2, 24, 20, 3) and image.dtype == torch.float32
    torch.testing.assert_close(image, ref, atol=TOL, rtol=0)


def test_ranks_given_different_latents_all_raise(cpu_pool, vae_dirs):
    z = torch.randn(1, 4, 8, 8)
    outs = cpu_pool(LAYOUTS["ulysses2"]).submit(vae_jobs.decode_mismatched, vae_dirs[4], z, result_rank="all")
    messages = outs.result(timeout=300)
    assert all("ranks disagree on the latent" in m for m in messages)
