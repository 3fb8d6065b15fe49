"""InstantX Qwen-Image ControlNet on the worker pool, against ComfyUI 0.3.64's own graph. Oracle:
tests/data/comfy_qwen_controlnet_reference.json, written by tests/data/make_comfy_qwen_controlnet_reference.py
(ControlNetLoader -> ControlNetApplyAdvanced with the hint VAE -> KSampler, on the tiny Qwen-Image file and
tests/controlnet_files.py's tiny InstantX Qwen-Image ControlNet). Here the same file goes through Parallel ControlNet
Loader's CONTROL_NET, configured by the calls ComfyUI's apply node makes, into the Parallel Sampler node on real CPU
pools: one rank, Ulysses 2, CFG 2, and PipeFusion 2 (also cfg 2 x pp 2, pp 2 x Ulysses 2) after a full warmup, with
stale K/V within a bound of it. Also: strength 0 equals no ControlNet bit for bit, ComfyUI's spread of the
ControlNet's blocks over Qwen-Image's 60, and the ControlNet's tokens stay split under Ulysses (bytes per step).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from comfy_ksampler_cases import frames_relative_error as relative_error  # tests/ helper
from comfy_ksampler_cases import load_manual, sample_zeros  # tests/ helper
from controlnet_files import QWEN_INSTANTX, qwen_instantx_state  # tests/ helper
from pack_import import load_pack  # tests/ helper

from parallel_runtime.denoise.control import ControlChain, ControlLink
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.controlnet_files import describe_controlnet
from parallel_runtime.models.families.qwen_image.controlnet import controlnet_blocks_used, spread
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.comfy_control import ParallelControlNet, controlnet

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from controlnet_hint_vae import HintVAE  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_qwen_controlnet_reference.json").read_text(encoding="utf-8"))
MODEL = DATA / REFERENCE["model_file"]
TOLERANCE = 1e-4  # relative L2
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def apply(positive, negative, net, image, strength, start, end, vae):
    """What ControlNetApplyAdvanced does: one configured copy per previous ControlNet, shared by both branches."""
    made: dict[int, ParallelControlNet] = {}
    out = []
    for conditioning in (positive, negative):
        entries = []
        for embeds, options in conditioning:
            previous = options.get("control")
            if id(previous) not in made:
                made[id(previous)] = (
                    net.copy()
                    .set_cond_hint(image.movedim(-1, 1), strength, (start, end), vae=vae)
                    .set_previous_controlnet(previous)
                )
            entries.append([embeds, {**options, "control": made[id(previous)], "control_apply_to_uncond": False}])
        out.append(entries)
    return out


def graph_conditioning(case: dict, with_control: bool = True):
    positive = [[tensor(f"text.{case['positive']}"), {}]]
    negative = [[tensor(f"text.{case['negative']}"), {}]]
    net, _ = controlnet(str(QWEN_INSTANTX))  # what Parallel ControlNet Loader hands on
    vae = HintVAE(frame_axis=True)
    for a in case["applies"] if with_control else ():
        image = tensor(f"hint.{a['hint']}")
        positive, negative = apply(
            positive, negative, net, image, a["strength"], a["start_percent"], a["end_percent"], vae
        )
    return positive, negative, vae


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def run_graph(ctx, handle, case, with_control: bool = True):
    positive, negative, vae = graph_conditioning(case, with_control)
    return sample_zeros(ctx, handle, positive, negative, case), vae


def _params():
    return [
        pytest.param(layout, case, id=f"{layout}-{case['name']}")
        for layout in LAYOUTS
        for case in REFERENCE["cases"]
        if not (layout == "cfg2" and math.isclose(case["cfg"], 1.0))
    ]


def test_stored_files_are_what_the_builders_make():
    from safetensors.torch import load_file

    stored, built = load_file(str(QWEN_INSTANTX)), qwen_instantx_state()
    assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built)
    assert hashlib.sha256(QWEN_INSTANTX.read_bytes()).hexdigest() == REFERENCE["controlnet_sha256"]
    assert hashlib.sha256(MODEL.read_bytes()).hexdigest() == REFERENCE["model_sha256"]
    info = describe_controlnet(QWEN_INSTANTX)
    assert (info.family, info.double_blocks, info.union_modes, info.hint_channels) == ("qwen-image", 2, 0, 16)


@pytest.mark.parametrize(("layout", "case"), _params())
def test_parallel_sampler_with_qwen_controlnet_equals_comfy(node_ctx, layout, case):
    handle = load_node(node_ctx, layout)
    got, vae = run_graph(node_ctx, handle, case)
    expected = tensor(f"{case['name']}.expected")
    error = relative_error(got, expected)
    assert error <= TOLERANCE, f"{case['name']} on {layout}: {error}"
    assert vae.calls == case["vae_encode_calls"]  # the hint was scaled to the latent's size, once per ControlNet
    if layout == "1rank":  # the ControlNet changes the picture (the test is not vacuous)
        plain, _ = run_graph(node_ctx, handle, case, with_control=False)
        assert relative_error(plain, expected) > 100 * TOLERANCE


def test_controlnet_blocks_spread_over_sixty():
    """ComfyUI's spread, worked by hand: 5 ControlNet blocks over 60 main blocks serve 12 each; 2 blocks serve 30
    each, so a 3-block model takes block 0 three times and block 1 is never run; past 60 nothing is added."""
    samples = [torch.full((1,), float(k)) for k in range(5)]
    got = spread(samples, 5, 62)
    assert [None if r is None else int(r) for r in got] == [i // 12 for i in range(60)] + [None, None]
    assert (
        controlnet_blocks_used(2, 3) == 1 and controlnet_blocks_used(5, 60) == 5 and controlnet_blocks_used(5, 13) == 2
    )
    assert [int(r) for r in spread(samples[:1], 2, 3)] == [0, 0, 0]


# -- the API: strength 0, bytes on the wire ------------------------------------------------------------------
def api_entry(strength: float = 1.0):
    from parallel_runtime.service.control_hint import encode_hint

    info = describe_controlnet(QWEN_INSTANTX)
    hint = encode_hint(tensor("hint.edges").movedim(-1, 1), HintVAE(frame_axis=True), (1, 16, 8, 12), info.hint_format)
    chain = ControlChain((ControlLink(str(QWEN_INSTANTX), hint, strength),))

    def entry(name: str, control: ControlChain | None) -> CondEntry:
        return CondEntry(Conditioning(tensor(f"text.{name}")), control=control)

    return entry, chain


def test_strength_zero_equals_no_controlnet(pool_registry):
    devices, config = LAYOUTS["ulysses2"]
    model = load_parallel_model(LoadRequest(model=str(MODEL), devices=devices, layout=config), pool_registry)
    entry, chain = api_entry()
    _, quiet = api_entry(strength=0.0)

    def sample(control):
        latent = torch.zeros(1, 16, 8, 12)
        return model.sample(
            (entry("pos7", control),), (entry("neg5", control),), latent, 96, 64, seed=7, steps=2, cfg=2.0
        )

    none = sample(None)
    assert not torch.equal(sample(chain), none)
    assert torch.equal(sample(quiet), none)


def test_qwen_controlnet_tokens_stay_split_under_ulysses(pool_registry):
    """Bytes each rank sends per step with the ControlNet minus without = the one ControlNet block it runs, its
    Ulysses all-to-alls over its own split sequence (formula); nothing more is gathered."""
    from tests.dist_jobs.control_jobs import generate_with_stats

    devices, config = LAYOUTS["ulysses2"]
    model = load_parallel_model(LoadRequest(model=str(MODEL), devices=devices, layout=config), pool_registry)
    entry, chain = api_entry()
    steps, latent = 2, torch.zeros(1, 16, 8, 12)
    settings = SamplingSettings(seed=7, steps=steps, cfg=1.0)
    runs = {}
    for name, control in (("plain", None), ("control", chain)):
        per_rank = model.pool.submit(
            generate_with_stats, (entry("pos7", control),), None, latent, settings, result_rank="all"
        ).result(300)
        runs[name] = [r["sent"] for r in per_rank]
    n, e, width = 2, 4, 32  # ranks, fp32 bytes, hidden width (2 heads x 16)
    local = [4 + 12, 3 + 12]  # each rank's text (7 split 4 + 3) and image tokens (4x6 split 12 + 12)
    total = sum(local)
    for rank, (plain, control) in enumerate(zip(runs["plain"], runs["control"])):
        # usp.py: q, k, v of its own tokens out ((n-1)/n of the heads), the attention output of the others' back
        per_attention = e * width // n * (3 * local[rank] * (n - 1) + (total - local[rank]))
        assert control["ulysses"] - plain["ulysses"] == steps * 1 * per_attention, rank
        assert control.get("gather", 0) == plain.get("gather", 0)  # only the main model's output is gathered
        assert set(control) - {"meta"} == set(plain) - {"meta"}


def load_node(ctx: NodeContext, layout: str):
    devices, config = LAYOUTS[layout]
    return load_manual(ctx, str(MODEL), devices, config, warmup=0)


# -- PipeFusion: the ControlNet runs on stage 0 per patch, the later stage's residuals travel with the patch --------
# Stale K/V (warmup 1, the default patches, the "chained" case) as a share of the seed difference: measured 0.0082.
PP_STALE_BOUND = 0.02
PP_LAYOUTS = {
    "pp2": ParallelConfig(pp=2),
    "cfg2xpp2": ParallelConfig(cfg=2, pp=2),
    "pp2xulysses2": ParallelConfig(pp=2, ulysses=2),
}


@pytest.mark.parametrize("config", list(PP_LAYOUTS.values()), ids=list(PP_LAYOUTS))
def test_qwen_controlnet_under_pipefusion_equals_comfy_after_full_warmup_and_stays_close_with_stale_kv(
    node_ctx, config
):
    """Every step a warmup step: each case (strengths, chained ControlNets with their windows, cfg 1 and both
    branches, an odd token grid) equals ComfyUI's graph to 1e-4; on the hybrids, where each CFG rank runs its own
    branch's ControlNet or stage 0 splits the ControlNet's tokens over Ulysses, the chained case. Warmup 1 on
    PipeFusion 2 (the ControlNet's K/V of the other patches stale, like the main model's): within PP_STALE_BOUND of
    the seed-to-seed difference, and not equal."""
    handle = load_manual(node_ctx, str(MODEL), f"cpu:{config.world_size}", config, warmup=5)
    cases = REFERENCE["cases"] if config.world_size == 2 else [c for c in REFERENCE["cases"] if c["name"] == "chained"]
    for case in cases:
        assert case["steps"] <= 5
        error = relative_error(run_graph(node_ctx, handle, case)[0], tensor(f"{case['name']}.expected"))
        assert error <= TOLERANCE, f"{case['name']} on {config}: {error}"
    if config.world_size > 2:
        return
    case = next(c for c in REFERENCE["cases"] if c["name"] == "chained")
    expected = tensor(f"{case['name']}.expected")
    shifted, _ = run_graph(node_ctx, handle, {**case, "seed": case["seed"] + 1})
    yardstick = float((shifted.reshape(expected.shape) - expected).abs().mean())
    stale, _ = run_graph(node_ctx, load_manual(node_ctx, str(MODEL), "cpu:2", config, warmup=1), case)
    error = float((stale.reshape(expected.shape) - expected).abs().mean()) / yardstick
    assert 0 < error < PP_STALE_BOUND, error
