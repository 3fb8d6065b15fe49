"""FLUX.1 Fill: InpaintModelConditioning's image and mask as extra input channels, on every layout.

Oracle: tests/data/comfy_fill_reference.json, written by tests/data/make_comfy_fill_reference.py with ComfyUI
0.3.64's own InpaintModelConditioning (noise_mask on), FluxGuidance and KSampler on a tiny Fill-structure file
(ComfyUI detects it as FluxInpaint). The test builds that file: the tiny Flux dev file with img_in 384 features
wide, seeded as the generator seeds it (its checksum is in the JSON). Through the Parallel Sampler node on real
CPU worker pools: one rank, Ulysses 2, CFG 2 and PipeFusion 2 with every step synchronous (stale K/V off) equal
ComfyUI's, and an odd-sized latent (padded to whole patches with its Fill channels) on one rank and Ulysses 2;
PipeFusion with patches (the image and mask cut with the row bands) keeps the unmasked latent.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pack_import import load_pack  # tests/ helper
from safetensors.torch import load_file, save_file

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.loop import prepare_denoise_mask
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.families.flux.adapter import FluxAdapter
from parallel_runtime.models.families.flux.fill import FluxFillInputs, fill_channels
from parallel_runtime.models.families.flux.latent import latent_format
from parallel_runtime.models.single_file import inspect_single_file
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.comfy_conditioning import to_branch

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_fill_reference.json").read_text(encoding="utf-8"))
CASES = {c["name"]: c for c in REFERENCE["cases"]}
TOLERANCE = 1e-4  # relative L2 (issue 25)
LAYOUTS = {
    "1rank": dict(devices="cpu:1"),
    "ulysses2": dict(devices="cpu:2", ulysses=2),
    "cfg2": dict(devices="cpu:2", cfg_parallel=2),
    "pipefusion2": dict(devices="cpu:2", pipefusion=2),
}
EXPECTED = {"embed_dim": 32, "pooled_dim": 24, "latent_channels": 16}  # the tiny file's widths


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


@pytest.fixture(scope="module")
def fill_file(tmp_path_factory) -> Path:
    """The tiny Fill file: the dev file's tensors, img_in seeded by name as the generator's fill_state does."""
    state = load_file(str(DATA / REFERENCE["base_file"]))
    shape = tuple(REFERENCE["img_in"]["shape"])
    gen = torch.Generator().manual_seed(zlib.crc32(b"img_in.weight"))
    weight = torch.randn(shape, generator=gen) * (1.0 / math.sqrt(shape[1]))
    state["img_in.weight"] = weight.to(torch.float16).contiguous()
    digest = hashlib.sha256(state["img_in.weight"].numpy().tobytes()).hexdigest()
    assert digest == REFERENCE["img_in"]["sha256"], "the Fill file differs from the one ComfyUI sampled"
    path = tmp_path_factory.mktemp("fill") / "tiny_flux1_fill.safetensors"
    save_file(state, str(path))
    return path


def conditioning(case: dict, role: str, fill: bool = True) -> list:
    """The CONDITIONING ComfyUI's InpaintModelConditioning gave (from the reference)."""
    name = case["name"]
    options: dict = {"pooled_output": tensor(f"{name}.{role}.pooled")}
    if role == "positive":
        options["guidance"] = case["guidance"]
    if fill:
        options["concat_latent_image"] = tensor(f"{name}.{role}.concat_latent_image")
        options["concat_mask"] = tensor(f"{name}.{role}.concat_mask")
    return [[tensor(f"{name}.{role}.embeds"), options]]


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def load(ctx: NodeContext, path: Path, layout: str, warmup: int = 0):
    spec = {"ulysses": 1, "ring": 1, "cfg_parallel": 1, "pipefusion": 1, **LAYOUTS[layout]}
    (handle,) = ParallelModelLoader(ctx).load(
        model=str(path), family="auto", layout="manual", pp_patches=0, pp_warmup=warmup, dtype="fp32",
        attention="auto", **spec,
    )["result"]  # fmt: skip
    return handle


def sample(ctx: NodeContext, handle, case: dict, fill: bool = True) -> torch.Tensor:
    name = case["name"]
    latent = {"samples": tensor(f"{name}.samples"), "noise_mask": tensor(f"{name}.noise_mask")}
    settings = [case[k] for k in ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")]
    (out,) = ParallelSampler(ctx).sample(
        handle, conditioning(case, "positive", fill), conditioning(case, "negative", fill), latent, *settings
    )["result"]
    return out["samples"]


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape, f"shape {tuple(got.shape)} vs ComfyUI's {tuple(expected.shape)}"
    return float((got.float() - expected).norm() / expected.norm())


def kept(case: dict) -> torch.Tensor:
    """Latent pixels the noise mask keeps whole (0 there at the latent's size: KSampler keeps the input)."""
    samples = tensor(f"{case['name']}.samples")
    return prepare_denoise_mask(tensor(f"{case['name']}.noise_mask"), tuple(samples.shape)) == 0


def test_fill_file_is_detected(fill_file):
    """img_in with 384 features (original layout) -> the flux-fill variant; its diffusers config plans."""
    info = inspect_single_file(fill_file)
    assert (info.family, info.variant) == ("flux", "flux-fill")
    assert (info.config["in_channels"], info.config["out_channels"]) == (384, 64)
    plan = FluxAdapter.make_plan(SimpleNamespace(**{**info.config, "patch_size": 1}), None)
    assert (plan.latent_channels, plan.out_channels) == (16, 16)
    dev = inspect_single_file(DATA / REFERENCE["base_file"])
    assert dev.variant == "flux-dev" and dev.config["in_channels"] == 64
    with pytest.raises(ConfigError, match="Fill"):  # Depth/Canny-style 128 features: not supported
        FluxAdapter.make_plan(SimpleNamespace(**{**info.config, "patch_size": 1, "in_channels": 128}), None)


def _params():
    for layout in LAYOUTS:
        for case in REFERENCE["cases"]:
            if layout == "cfg2" and math.isclose(case["cfg"], 1.0):
                continue
            if layout == "pipefusion2" and "pixels" in case:  # PipeFusion takes whole 16 px bands only
                continue
            yield pytest.param(layout, case, id=f"{layout}-{case['name']}")


@pytest.mark.parametrize(("layout", "case"), list(_params()))
def test_fill_equals_comfy_ksampler(node_ctx, fill_file, layout, case):
    got = sample(node_ctx, load(node_ctx, fill_file, layout, warmup=case["steps"]), case)
    error = relative_error(got, tensor(f"{case['name']}.expected"))
    assert error <= TOLERANCE, f"{case['name']} on {layout}: relative error {error:.2e}"
    where = kept(case)
    assert where.any() and not where.all()
    torch.testing.assert_close(got[where], tensor(f"{case['name']}.samples")[where], rtol=0, atol=1e-5)


def test_pipefusion_patches_cut_the_fill_channels(node_ctx, fill_file):
    """Stale K/V after one synchronous step: the unmasked latent is kept exactly, the rest stays close."""
    case = CASES["fill_guidance"]
    got = sample(node_ctx, load(node_ctx, fill_file, "pipefusion2", warmup=1), case)
    where = kept(case)
    torch.testing.assert_close(got[where], tensor(f"{case['name']}.samples")[where], rtol=0, atol=1e-5)
    assert relative_error(got, tensor(f"{case['name']}.expected")) < 0.05


def test_fill_channels_formula():
    """The 96 channels per latent pixel: the latent, the image in model space, the 8x8 mask block."""
    x = torch.zeros(1, 16, 8, 6)
    image, mask = tensor("fill_cfg.positive.concat_latent_image"), tensor("fill_cfg.positive.concat_mask")
    joined = fill_channels(x, FluxFillInputs(image, mask), latent_format(16))
    assert joined.shape == (1, 96, 8, 6)
    torch.testing.assert_close(joined[:, 16:32], (image - 0.1159) * 0.3611)
    # latent pixel (r, c)'s 64 mask channels are its 8x8 block of mask pixels, row-major
    torch.testing.assert_close(joined[0, 32:, 5, 2].reshape(8, 8), mask[0, 0, 40:48, 16:24])


def test_fill_errors_say_what_why_fix(fill_file):
    """On the host: a Fill model without InpaintModelConditioning, a plain model with it, half of it."""
    case = CASES["fill_guidance"]
    fill, plain = {**EXPECTED, "in_channels": 384}, {**EXPECTED, "in_channels": 64}
    (entry,) = to_branch(conditioning(case, "positive"), fill, "flux")
    assert isinstance(entry.cond.extras, FluxFillInputs)
    with pytest.raises(ConfigError, match="no inpainting image and mask for a FLUX.1 Fill"):
        to_branch(conditioning(case, "positive", fill=False), fill, "flux")
    with pytest.raises(ConfigError, match="without extra input channels"):
        to_branch(conditioning(case, "positive"), plain, "flux")
    half = conditioning(case, "positive")
    del half[0][1]["concat_mask"]
    with pytest.raises(ConfigError, match="why:"):
        to_branch(half, fill, "flux")
    assert to_branch(conditioning(case, "positive", fill=False), plain, "flux")[0].cond.extras is None


def test_api_refuses_a_fill_model_without_its_inputs(pool_registry, fill_file):
    """The runtime API (no CONDITIONING to read) gets the same refusal on the host: no silent blank image."""
    case = CASES["fill_guidance"]
    model = load_parallel_model(LoadRequest(model=str(fill_file), devices="cpu:1"), pool_registry)
    name, latent = case["name"], tensor(f"{case['name']}.samples")
    cond = Conditioning(tensor(f"{name}.positive.embeds"), tensor(f"{name}.positive.pooled"))
    branch = (CondEntry(cond, guidance=case["guidance"]),)
    with pytest.raises(ConfigError, match="no inpainting image and mask for a FLUX.1 Fill model"):
        model.sample(branch, branch, latent, 48, 64, seed=1, steps=1, cfg=1.0, sampler_name="euler",
                     scheduler="simple", denoise=1.0)  # fmt: skip
