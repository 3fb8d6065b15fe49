"""Live previews for every family, made on the worker from the family's declared latent -> RGB factors: equal to
ComfyUI's own previewer on the same latent (tests/data/comfy_preview_image_reference.json, made with ComfyUI
0.3.64's Latent2RGBPreviewer), a video as a sheet of its frames, FLUX.2 (no factors in ComfyUI 0.3.64) in false
colour from its latent's principal components; and the Parallel Sampler shows one per step for every family."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from node_helpers import RecordingBridge, load  # tests/ helpers
from pack_import import load_pack

from parallel_runtime.models.families.flux.latent import latent_format as flux_format
from parallel_runtime.models.families.pixart.latent import latent_format as pixart_format
from parallel_runtime.models.families.registry import family
from parallel_runtime.models.families.sd3.latent import latent_format as sd3_format
from parallel_runtime.models.families.wan.latent import WAN21, WAN22
from parallel_runtime.models.latent_formats import LatentFormat
from parallel_runtime.models.preview import MAX_SIDE, frame_picks, plan_preview, preview_image

load_pack()
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.latent import ParallelEmptyLatent  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402
from dit_parallel_pack.nodes.text_encode import ParallelTextEncode  # noqa: E402

REF = json.loads((Path(__file__).parent / "data" / "comfy_preview_image_reference.json").read_text())["cases"]

# (family, the latent format a model of it has) -> the ComfyUI format whose previews KSampler shows for it
MODELS = [
    ("flux", flux_format(16), "Flux"),
    ("sd3", sd3_format(16), "SD3"),
    ("pixart", pixart_format(4, True), "SD15"),  # PixArt-alpha
    ("pixart", pixart_format(4, False), "SDXL"),  # PixArt-Sigma
    ("qwen-image", WAN21, "Wan21"),
    ("wan", WAN21, "Wan21"),
    ("wan", WAN22, "Wan22"),
]


def tensor(entry: dict) -> torch.Tensor:
    return torch.tensor(entry["data"], dtype=torch.float32).reshape(entry["shape"])


@pytest.mark.parametrize(("family_id", "fmt", "comfy"), MODELS, ids=[f"{f}-{c}" for f, _, c in MODELS])
def test_previews_equal_comfyuis_previewer(family_id, fmt, comfy):
    case = REF[comfy]
    x0 = tensor(case["x0"])
    ours = plan_preview(SimpleNamespace(family=family_id, latent_format=fmt), x0)
    theirs = torch.tensor(case["image"], dtype=torch.int16)  # ComfyUI shows a video's first frame only
    h, w = theirs.shape[:2]
    assert ours.dtype == torch.uint8
    first = ours[:h, :w].to(torch.int16)
    assert int((first - theirs).abs().max()) <= 1, f"{family_id}: not ComfyUI's {comfy} preview"
    if x0.ndim == 5:  # our video preview: every frame, side by side (two frames: one row of two)
        assert ours.shape == (h, 2 * w, 3)
        second = plan_preview(SimpleNamespace(family=family_id, latent_format=fmt), x0[:, :, 1:])
        assert torch.equal(ours[:, w:], second)


def test_a_video_preview_is_a_sheet_of_its_frames():
    frames = 21  # Wan's 81 video frames
    x0 = torch.zeros(1, 16, frames, 6, 8)
    for t in range(frames):
        x0[:, :, t] = (t - 10) / 10.0  # a distinct, uniform picture per frame
    sheet = preview_image(x0, family("wan").preview_for(WAN21))
    picks = frame_picks(frames)
    assert picks[0] == 0 and picks[-1] == frames - 1 and len(picks) == 16
    assert sheet.shape == (4 * 6, 4 * 8, 3)  # 16 frames: 4 rows of 4
    tiles = [sheet[r * 6 : (r + 1) * 6, c * 8 : (c + 1) * 8] for r in range(4) for c in range(4)]
    for tile, t in zip(tiles, picks):
        assert torch.equal(tile, preview_image(x0[:, :, t : t + 1], family("wan").preview_for(WAN21)))
    assert len({tuple(tile[0, 0].tolist()) for tile in tiles}) == 16  # every tile another frame


def test_big_latents_shrink_to_the_preview_size():
    image = preview_image(torch.randn(1, 16, 512, 256), family("flux").preview_for(flux_format(16)))
    assert image.shape == (MAX_SIDE, MAX_SIDE // 2, 3)
    sheet = preview_image(torch.randn(1, 16, 21, 60, 104), family("wan").preview_for(WAN21))
    assert max(sheet.shape[:2]) <= MAX_SIDE


def test_flux2_previews_show_its_latent_in_false_colour():
    """ComfyUI 0.3.64 states no FLUX.2 factors: the preview shows where things are (principal components)."""
    fmt = LatentFormat(128, 1.0, 0.0)
    assert family("flux2").preview_for(fmt) is None
    a, b = torch.randn(128), torch.randn(128)
    x0 = torch.empty(1, 128, 8, 8)
    x0[..., :4] = a.view(1, 128, 1, 1)  # left: one thing
    x0[..., 4:] = b.view(1, 128, 1, 1)  # right: another
    x0 = x0 + 0.01 * torch.randn_like(x0)
    image = plan_preview(SimpleNamespace(family="flux2", latent_format=fmt), x0)
    left, right = image[:, :4].float(), image[:, 4:].float()
    assert (left.std(dim=(0, 1)) < 8).all() and (right.std(dim=(0, 1)) < 8).all()  # each side one colour
    assert (left.mean(dim=(0, 1)) - right.mean(dim=(0, 1))).abs().max() > 100  # ... and the two far apart
    negated = plan_preview(SimpleNamespace(family="flux2", latent_format=fmt), -x0)  # the basis is signed by its
    assert int((negated.int() - (255 - image.int())).abs().max()) <= 1  # loadings: -x0 shows the inverse colours


@pytest.fixture(scope="module")
def ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=RecordingBridge())


@pytest.mark.parametrize(
    ("model", "length", "picture"),
    [
        ("tiny-qwen-image", 1, (4, 4, 3)),
        ("tiny-flux2", 1, (2, 2, 3)),  # its LATENT packs 2x2: 16 px a latent pixel
        ("tiny-wan", 9, (8, 8, 3)),  # 3 latent frames of 4x4: a sheet of 2 x 2 tiles
    ],
)
def test_the_sampler_shows_a_preview_each_step_for_every_family(ctx, model, length, picture):
    """These families sampled blind before (their previews used SD1.5's 4-channel factors and failed)."""
    handle, _ = load(ctx, model, devices="cpu:1")
    (pos,) = ParallelTextEncode().encode(handle, "a fox")
    (latent,) = ParallelEmptyLatent().generate(handle, 32, 32, 1, length=length)
    ctx.bridge.previews.clear()
    ParallelSampler(ctx).sample(handle, pos, pos, latent, 1, 3, 1.0, "euler", "simple", 1.0)
    assert len(ctx.bridge.previews) == 3
    for image in ctx.bridge.previews:
        assert image.dtype == torch.uint8 and tuple(image.shape) == picture
    assert not torch.equal(ctx.bridge.previews[0], ctx.bridge.previews[-1])  # the picture moves with the steps
