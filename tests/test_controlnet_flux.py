"""Flux InstantX / Union ControlNet on the worker pool, against ComfyUI 0.3.64's own graph. Oracle:
tests/data/comfy_controlnet_reference.json, written by tests/data/make_comfy_controlnet_reference.py
(ControlNetLoader -> SetUnionControlNetType -> ControlNetApplyAdvanced with the hint VAE -> KSampler, on the tiny
FLUX.1-dev file and tests/controlnet_files.py's tiny Union ControlNet). Here the same file goes through Parallel
ControlNet Loader's CONTROL_NET, configured by the calls ComfyUI's apply nodes make, into the Parallel Sampler node
on real CPU pools: one rank, Ulysses 2, CFG 2, and PipeFusion 2 (also cfg 2 x pp 2, pp 2 x Ulysses 2) after a full
warmup; with stale K/V within a bound of it. Also: strength 0 and a start/end window outside the run equal no
ControlNet bit for bit; a step / block cache is refused on the host; the ControlNet's tokens stay split under
Ulysses, and under PipeFusion only the later stage's residuals travel with each patch (bytes sent against the
formulas).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from pathlib import Path

import pytest
import torch
from comfy_ksampler_cases import load_manual, relative_error  # tests/ helper
from controlnet_files import FLUX_UNION, flux_union_state  # tests/ helper
from pack_import import load_pack  # tests/ helper

from parallel_runtime.denoise.caching.specs import BlockCacheSpec, StepCacheSpec
from parallel_runtime.denoise.control import ControlChain, ControlLink
from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.settings import SamplingSettings
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.models.controlnet_files import describe_controlnet
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model
from parallel_runtime.service.comfy_control import ParallelControlNet

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
from controlnet_hint_vae import HintVAE  # noqa: E402

REFERENCE = json.loads((DATA / "comfy_controlnet_reference.json").read_text(encoding="utf-8"))
MODEL = DATA / REFERENCE["model_file"]
TOLERANCE = 1e-4  # relative L2
UNION_TYPES = {"openpose": 0, "depth": 1, "canny/lineart/anime_lineart/mlsd": 3, "auto": None}  # ComfyUI's names
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
}


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def union_type(net: ParallelControlNet, name: str) -> ParallelControlNet:
    """What SetUnionControlNetType does to a CONTROL_NET: a copy with the type as its control_type."""
    typed = net.copy()
    index = UNION_TYPES[name]
    typed.set_extra_arg("control_type", [] if index is None else [index])
    return typed


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


def graph_conditioning(case: dict):
    positive = [[tensor(f"{case['name']}.pos"), {"pooled_output": tensor(f"{case['name']}.pos_pooled")}]]
    negative = [[tensor(f"{case['name']}.neg"), {"pooled_output": tensor(f"{case['name']}.neg_pooled")}]]
    net = ParallelControlNet(describe_controlnet(FLUX_UNION))
    vae = HintVAE()
    for a in case["applies"]:
        image = tensor(f"hint.{a['hint']}")
        positive, negative = apply(
            positive,
            negative,
            union_type(net, a["type"]),
            image,
            a["strength"],
            a["start_percent"],
            a["end_percent"],
            vae,
        )
    return positive, negative, vae


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def _params():
    return [
        pytest.param(layout, case, id=f"{layout}-{case['name']}")
        for layout in LAYOUTS
        for case in REFERENCE["cases"]
        if not (layout == "cfg2" and case["cfg"] == 1.0)
    ]


def test_stored_controlnet_file_is_what_the_builder_makes():
    from safetensors.torch import load_file

    stored, built = load_file(str(FLUX_UNION)), flux_union_state()
    assert stored.keys() == built.keys() and all(torch.equal(stored[k], built[k]) for k in built)
    info = describe_controlnet(FLUX_UNION)
    assert (info.union_modes, info.double_blocks, info.single_blocks, info.hint_channels) == (10, 1, 2, 16)


@pytest.mark.parametrize(("layout", "case"), _params())
def test_parallel_sampler_with_controlnet_equals_comfy(node_ctx, layout, case):
    handle = load_node(node_ctx, layout)
    positive, negative, vae = graph_conditioning(case)
    latent = {"samples": torch.zeros(1, 16, case["latent"][1] // 8, case["latent"][0] // 8)}
    result = ParallelSampler(node_ctx).sample(
        handle,
        positive,
        negative,
        latent,
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler_name"],
        case["scheduler"],
        1.0,
    )
    got = result["result"][0]["samples"]
    expected = tensor(f"{case['name']}.expected")
    error = relative_error(got, expected)
    assert error <= TOLERANCE, f"{case['name']} on {layout}: {error}"
    assert vae.calls == case["vae_encode_calls"]  # the hint was scaled to the latent's size, once per ControlNet
    if layout != "1rank":
        return
    plain = ParallelSampler(node_ctx).sample(  # the ControlNet changes the picture (the test is not vacuous)
        handle,
        [[e[0], {"pooled_output": e[1]["pooled_output"]}] for e in positive],
        [[e[0], {"pooled_output": e[1]["pooled_output"]}] for e in negative],
        latent,
        case["seed"],
        case["steps"],
        case["cfg"],
        case["sampler_name"],
        case["scheduler"],
        1.0,
    )["result"][0]["samples"]
    assert relative_error(plain, expected) > 100 * TOLERANCE


# -- the API: strength 0, a window outside the run, PipeFusion, bytes on the wire ----------------------------
def api_case(strength: float = 1.0, start: float = 0.0, end: float = 1.0, control_type=(3,)):
    case = REFERENCE["cases"][0]
    vae = HintVAE()
    info = describe_controlnet(FLUX_UNION)
    from parallel_runtime.service.control_hint import encode_hint

    hint = encode_hint(tensor("hint.edges").movedim(-1, 1), vae, (1, 16, 4, 6), info.hint_format)
    chain = ControlChain((ControlLink(str(FLUX_UNION), hint, strength, start, end, tuple(control_type)),))

    def entry(role: str, control: ControlChain | None) -> CondEntry:
        cond = Conditioning(tensor(f"{case['name']}.{role}"), tensor(f"{case['name']}.{role}_pooled"))
        return CondEntry(cond, control=control)

    return entry, chain


def sample(model, entry, control, cfg: float = 2.0, steps: int = 3) -> torch.Tensor:
    latent = torch.zeros(1, 16, 4, 6)
    return model.sample(
        (entry("pos", control),), (entry("neg", control),), latent, 48, 32, seed=7, steps=steps, cfg=cfg
    )


@pytest.mark.parametrize("layout", ["1rank", "ulysses2"])
def test_strength_zero_and_a_window_outside_the_run_equal_no_controlnet(pool_registry, layout):
    devices, config = LAYOUTS[layout]
    model = load_parallel_model(LoadRequest(model=str(MODEL), devices=devices, layout=config), pool_registry)
    entry, chain = api_case()
    none = sample(model, entry, None)
    assert not torch.equal(sample(model, entry, chain), none)
    for kwargs in ({"strength": 0.0}, {"start": 1.0, "end": 1.0}):
        _, quiet = api_case(**kwargs)
        assert torch.equal(sample(model, entry, quiet), none), kwargs


def test_controlnet_errors_on_the_host(pool_registry):
    entry, chain = api_case()
    one = load_parallel_model(LoadRequest(model=str(MODEL), devices="cpu:1"), pool_registry)
    _, bad_type = api_case(control_type=(10,))
    with pytest.raises(ConfigError, match="control type 10"):
        sample(one, entry, bad_type)
    for cache in (StepCacheSpec("easycache"), StepCacheSpec("lazycache"), BlockCacheSpec()):
        with pytest.raises(ConfigError, match="ControlNet .* with a cache") as refused:
            sample(one.with_cache(cache), entry, chain)
        assert cache.describe() in str(refused.value)


def test_controlnet_tokens_stay_split_under_ulysses(pool_registry):
    """Bytes each rank sends per step with the ControlNet minus without = its 3 blocks' Ulysses all-to-alls over
    its own split sequence (formula), and nothing gathered: an unsplit ControlNet would send other bytes."""
    from tests.dist_jobs.control_jobs import generate_with_stats

    devices, config = LAYOUTS["ulysses2"]
    model = load_parallel_model(LoadRequest(model=str(MODEL), devices=devices, layout=config), pool_registry)
    entry, chain = api_case()
    steps, latent = 2, torch.zeros(1, 16, 4, 6)
    settings = SamplingSettings(seed=7, steps=steps, cfg=1.0)
    runs = {}
    for name, control in (("plain", None), ("control", chain)):
        per_rank = model.pool.submit(
            generate_with_stats, (entry("pos", control),), None, latent, settings, result_rank="all"
        ).result(300)
        runs[name] = [r["sent"] for r in per_rank]
    n, e, width = 2, 4, 64  # ranks, fp32 bytes, hidden width (4 heads x 16)
    tokens = 5 + 1 + 2 * 3  # text, the union mode token, 2x3 image tokens
    per_attention = 4 * e * 1 * tokens * width * (n - 1) // (n * n)  # usp.py: q, k, v out, output back
    for plain, control in zip(runs["plain"], runs["control"]):
        assert control["ulysses"] - plain["ulysses"] == steps * 3 * per_attention
        assert control.get("gather", 0) == plain.get("gather", 0)  # only the main model's output is gathered
        assert set(control) - {"meta"} == set(plain) - {"meta"}


def load_node(ctx: NodeContext, layout: str):
    devices, config = LAYOUTS[layout]
    return load_manual(ctx, str(MODEL), devices, config)


# -- PipeFusion: the ControlNet runs on stage 0 per patch, the later stage's residuals travel with the patch --------
# Stale K/V (warmup 1, 2 patches, the "chained" case) as a share of the seed difference: measured 0.0124; the same
# run without the ControlNets 0.0092.
PP_STALE_BOUND = 0.03
PP_LAYOUTS = {
    "pp2": ParallelConfig(pp=2),
    "cfg2xpp2": ParallelConfig(cfg=2, pp=2),
    "pp2xulysses2": ParallelConfig(pp=2, ulysses=2),
}


def pp_run(model, positive, negative, settings, warmup: int, patches: int | None = None):
    """(latent, per-rank PipeFusionStats) of a PipeFusion run on ``model``'s pool."""
    from parallel_runtime.tools.bench_pipefusion import generate_with_stats

    args = (positive, negative, torch.zeros(1, 16, 4, 6), settings, patches, warmup)
    per_rank = model.pool.submit(generate_with_stats, *args, result_rank="all").result(300)
    return per_rank[0]["latent"], [r["stats"] for r in per_rank]


@pytest.mark.parametrize("config", list(PP_LAYOUTS.values()), ids=list(PP_LAYOUTS))
def test_controlnet_under_pipefusion_equals_comfy_after_full_warmup(node_ctx, config):
    """Every step a warmup step: each case through the Parallel Sampler node equals ComfyUI's graph to 1e-4 (the
    union types, strengths, chained ControlNets with their windows, cfg 1 and both CFG branches); on the hybrids,
    where each CFG rank runs its own branch's ControlNet or stage 0 splits the ControlNet's tokens over Ulysses,
    the chained case."""
    devices = f"cpu:{config.world_size}"
    handle = load_manual(node_ctx, str(MODEL), devices, config, warmup=5)
    cases = REFERENCE["cases"] if config.world_size == 2 else [c for c in REFERENCE["cases"] if c["name"] == "chained"]
    for case in cases:
        assert case["steps"] <= 5
        positive, negative, _ = graph_conditioning(case)
        latent = {"samples": torch.zeros(1, 16, case["latent"][1] // 8, case["latent"][0] // 8)}
        settings = (case["seed"], case["steps"], case["cfg"], case["sampler_name"], case["scheduler"], 1.0)
        got = ParallelSampler(node_ctx).sample(handle, positive, negative, latent, *settings)["result"][0]["samples"]
        error = relative_error(got, tensor(f"{case['name']}.expected"))
        assert error <= TOLERANCE, f"{case['name']} on {config}: {error}"


def chained_entries(with_control: bool = True):
    """The "chained" case at the API: depth (union type 1) 0.7 over 0..0.6, then edges (no type) 0.5 over 0.3..1;
    texts of 5 and 3 tokens (two streams)."""
    from parallel_runtime.service.control_hint import encode_hint

    info, vae = describe_controlnet(FLUX_UNION), HintVAE()
    hint = lambda name: encode_hint(tensor(f"hint.{name}").movedim(-1, 1), vae, (1, 16, 4, 6), info.hint_format)  # noqa: E731
    links = (
        ControlLink(str(FLUX_UNION), hint("depth"), 0.7, 0.0, 0.6, (1,)),
        ControlLink(str(FLUX_UNION), hint("edges"), 0.5, 0.3, 1.0, ()),
    )
    chain = ControlChain(links) if with_control else None
    return tuple(
        (CondEntry(Conditioning(tensor(f"chained.{r}"), tensor(f"chained.{r}_pooled")), control=chain),)
        for r in ("pos", "neg")
    )


def test_controlnet_under_pipefusion_with_stale_kv_stays_close_and_sends_only_the_later_residuals(pool_registry):
    """Warmup 1, 2 patches (the ControlNet attends over its own stale K/V of the other patch, as the main model
    does): within PP_STALE_BOUND of the seed-to-seed difference from the full-warmup result (equal to ComfyUI, the
    test above), and not equal. Bytes: stage 0 sends stage 1 the residual of stage 1's one block (the tiny model's
    single block) for each stream's tokens once per step: steps x streams x tokens x width x 4, with 2 patches as
    with the whole image; the activations' bytes are those of the run without a ControlNet and stage 1 sends
    nothing of it. Stage 0 runs each token through the ControlNets once per step and active link (as on one
    device, not once per patch); stage 1 runs none."""
    model = load_parallel_model(
        LoadRequest(model=str(MODEL), devices="cpu:2", layout=ParallelConfig(pp=2)), pool_registry
    )
    case = next(c for c in REFERENCE["cases"] if c["name"] == "chained")
    steps, settings = case["steps"], SamplingSettings(seed=7, steps=case["steps"], cfg=case["cfg"])
    positive, negative = chained_entries()
    exact, whole = pp_run(model, positive, negative, settings, warmup=steps)
    assert relative_error(exact.reshape(1, 16, 4, 6), tensor("chained.expected")) <= TOLERANCE
    shifted, _ = pp_run(model, positive, negative, dataclasses.replace(settings, seed=8), warmup=steps)
    yardstick = float((shifted - exact).abs().mean())
    stale, stats = pp_run(model, positive, negative, settings, warmup=1, patches=2)
    error = float((stale - exact).abs().mean()) / yardstick
    assert 0 < error < PP_STALE_BOUND, error
    _, plain = pp_run(model, *chained_entries(with_control=False), settings, warmup=1, patches=2)
    streams, tokens, width = 2, 2 * 3, 64
    for runs in (stats, whole):
        first, second = sorted(runs, key=lambda s: s.stage)
        assert first.sent_bytes["pp_control"] == steps * streams * tokens * width * 4
        assert "pp_control" not in second.sent_bytes and second.chain_tokens == 0
    assert [s.chain_tokens for s in stats] == [s.chain_tokens for s in whole] and stats[0].chain_tokens > 0
    for with_control, without in zip(stats, plain):
        assert {k: v for k, v in with_control.sent_bytes.items() if k != "pp_control"} == without.sent_bytes
