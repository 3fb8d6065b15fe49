"""Area and mask conditioning (ConditioningSetArea / SetAreaPercentage / SetAreaStrength / SetMask with
"mask bounds" / SetTimestepRange, combined with ConditioningCombine) on every layout: the Parallel Sampler
(node and API) against ComfyUI 0.3.64's own nodes + KSampler.

Oracle: tests/data/comfy_regions_reference.json (tests/data/make_comfy_regions_reference.py, on the tiny Flux
dev file of the KSampler reference). One rank, Ulysses 2, CFG 2 (cases with cfg > 1) and PipeFusion 2 with every
step synchronous equal ComfyUI's to 1e-4; PipeFusion with patches (stale K/V) stays within its bound of ComfyUI's,
and keeps one K/V state per stream of entries.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import pytest
import torch
from pack_import import load_pack  # tests/ helper

from parallel_runtime.denoise.entries import CondEntry
from parallel_runtime.denoise.regions import Region, pair_areas, place
from parallel_runtime.errors import ConfigError
from parallel_runtime.models.base import Conditioning
from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.service.api import LoadRequest, load_parallel_model

load_pack()
from dit_parallel_pack.nodes.bridge import ComfyBridge  # noqa: E402
from dit_parallel_pack.nodes.context import NodeContext  # noqa: E402
from dit_parallel_pack.nodes.loader import ParallelModelLoader  # noqa: E402
from dit_parallel_pack.nodes.sampler import ParallelSampler  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
REFERENCE = json.loads((DATA / "comfy_regions_reference.json").read_text(encoding="utf-8"))
CASES = {c["name"]: c for c in REFERENCE["cases"]}
TOLERANCE = 1e-4  # relative L2, as the KSampler fidelity tests
LAYOUTS = {
    "1rank": ("cpu:1", ParallelConfig()),
    "ulysses2": ("cpu:2", ParallelConfig(ulysses=2)),
    "cfg2": ("cpu:2", ParallelConfig(cfg=2)),
    "pipefusion2": ("cpu:2", ParallelConfig(pp=2)),
}
PIPEFUSION_CASES = ("regions_areas_mask", "regions_cfg1")  # the other one's "mask bounds" box is not whole tokens


@functools.cache
def tensor(name: str) -> torch.Tensor:
    t = REFERENCE["tensors"][name]
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def comfy_conditioning(case: dict, role: str) -> list:
    """The case's CONDITIONING as ComfyUI's nodes made it (the options they set, the stored tensors)."""
    out = []
    for i, record in enumerate(case[role]):
        name = f"{case['name']}.{role}.{i}"
        options = {"pooled_output": tensor(f"{name}.pooled")}
        for key, value in record.items():
            if key == "mask":
                options[key] = tensor(value)
            elif key == "area":
                options[key] = tuple(value)
            else:
                options[key] = value
        out.append([tensor(f"{name}.embeds"), options])
    return out


def api_branch(case: dict, role: str) -> tuple[CondEntry, ...]:
    """The same entries written with the runtime's API (CondEntry + Region)."""
    entries = []
    for embeds, options in comfy_conditioning(case, role):
        area = options.get("area")
        region = None
        if area is not None or "mask" in options:
            percent = area is not None and area[0] == "percentage"
            region = Region(
                area=None if area is None or percent else tuple(area),
                area_fraction=tuple(area[1:]) if percent else None,
                mask=options.get("mask"),
                mask_strength=options.get("mask_strength", 1.0),
                set_area_to_bounds=options.get("set_area_to_bounds", False),
            )
        entries.append(
            CondEntry(
                Conditioning(embeds, options["pooled_output"]),
                strength=options.get("strength", 1.0),
                start_percent=options.get("start_percent"),
                end_percent=options.get("end_percent"),
                region=region,
            )
        )
    return tuple(entries)


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    assert got.shape == expected.shape
    return float((got.float() - expected).norm() / expected.norm())


def settings(case: dict) -> dict:
    return {k: case[k] for k in ("seed", "steps", "cfg", "sampler_name", "scheduler", "denoise")}


@pytest.fixture(scope="module")
def node_ctx(pool_registry):
    return NodeContext.create(registry=pool_registry, bridge=ComfyBridge())


def run_node(ctx: NodeContext, devices: str, config: ParallelConfig, case: dict, warmup: int) -> torch.Tensor:
    (handle,) = ParallelModelLoader(ctx).load(
        model=str(DATA / REFERENCE["model"]), family="auto", devices=devices, layout="manual",
        ulysses=config.ulysses, ring=1, cfg_parallel=config.cfg, pipefusion=config.pp, pp_patches=0,
        pp_warmup=warmup, dtype="fp32", attention="auto",
    )["result"]  # fmt: skip
    (latent_out,) = ParallelSampler(ctx).sample(
        handle, comfy_conditioning(case, "positive"), comfy_conditioning(case, "negative"),
        {"samples": tensor("samples")}, **settings(case),
    )["result"]  # fmt: skip
    return latent_out["samples"]


def run_api(registry, devices: str, config: ParallelConfig, case: dict, warmup: int, **load) -> torch.Tensor:
    request = LoadRequest(
        model=str(DATA / REFERENCE["model"]), devices=devices, layout=config, pp_warmup=warmup, **load
    )
    model = load_parallel_model(request, registry)
    latent = tensor("samples")
    return model.sample(
        api_branch(case, "positive"), api_branch(case, "negative"), latent, latent.shape[-1] * 8,
        latent.shape[-2] * 8, **settings(case),
    )  # fmt: skip


def _params():
    for layout in LAYOUTS:
        for case in REFERENCE["cases"]:
            if layout == "cfg2" and math.isclose(case["cfg"], 1.0):
                continue
            if layout == "pipefusion2" and case["name"] not in PIPEFUSION_CASES:
                continue
            yield pytest.param(layout, case, id=f"{layout}-{case['name']}")


@pytest.mark.parametrize(("layout", "case"), list(_params()))
def test_regions_equal_comfy_ksampler(node_ctx, pool_registry, layout, case):
    devices, config = LAYOUTS[layout]
    expected = tensor(f"{case['name']}.expected")
    errors = {
        "node": relative_error(run_node(node_ctx, devices, config, case, case["steps"]), expected),
        "api": relative_error(run_api(pool_registry, devices, config, case, case["steps"]), expected),
    }
    assert max(errors.values()) <= TOLERANCE, f"{case['name']} on {layout}: {errors}"


# -- PipeFusion -----------------------------------------------------------------------------------------------
def without_bounds(case: dict) -> dict:
    """The case without its "mask bounds" entry (whose box starts on an odd latent row)."""
    positive = [e for e in case["positive"] if not e.get("set_area_to_bounds")]
    return {**case, "positive": positive}


def test_pipefusion_refuses_areas_of_part_tokens(pool_registry):
    with pytest.raises(ConfigError, match="under PipeFusion") as err:
        run_api(pool_registry, "cpu:2", ParallelConfig(pp=2), CASES["regions_bounds_percentage"], 3)
    assert "multiples of 16 px" in str(err.value)


def test_pipefusion_timestep_range_percentage_and_negative_area_equal_one_rank(pool_registry):
    """Percentage area, timestep range, area strength and a negative area (heun: two evaluations per step)
    under PipeFusion with every step synchronous equal the single device's result."""
    case = {**without_bounds(CASES["regions_bounds_percentage"]), "name": "regions_bounds_percentage"}
    one = run_api(pool_registry, "cpu:1", ParallelConfig(), case, case["steps"])
    piped = run_api(pool_registry, "cpu:2", ParallelConfig(pp=2), case, case["steps"])
    assert relative_error(piped, one) <= 1e-5


def test_pipefusion_patches_stay_within_the_stale_bound(pool_registry):
    """Row-band patches after one synchronous step: each stream attends over its own stale K/V and the result
    stays close to ComfyUI's (the bound of tests/test_inpaint.py's patched runs)."""
    case = CASES["regions_areas_mask"]
    expected = tensor(f"{case['name']}.expected")
    patched = run_api(pool_registry, "cpu:2", ParallelConfig(pp=2), case, warmup=1, pp_patches=3)
    assert 0.0 < relative_error(patched, expected) < 0.05


def test_pipefusion_keeps_one_kv_state_per_stream(cpu_pool):
    """Every stream (entries run as one call over one window) has its own stale K/V buffers sized for its
    text and window tokens: the stages' buffers hold sum(text + window tokens) over the streams, against
    (text + image tokens) for one plain prompt. Entries sharing one state would hold far less (or fail)."""
    from pipefusion_cases import load

    from parallel_runtime.denoise.settings import SamplingSettings
    from parallel_runtime.tools.bench_pipefusion import generate_with_stats

    pool = cpu_pool(ParallelConfig(pp=2))
    load(pool, DATA / REFERENCE["model"])
    case = CASES["regions_areas_mask"]
    latent = tensor("samples")
    settings = SamplingSettings(seed=3, steps=2, cfg=2.0, sampler="euler", scheduler="simple")

    def kv_bytes(positive, negative, cfg) -> int:
        job = (generate_with_stats, positive, negative, latent, dataclasses.replace(settings, cfg=cfg), 3, 1)
        return sum(r["stats"].kv_buffer_bytes for r in pool.submit(*job, result_rank="all").result(300))

    pos, neg = api_branch(case, "positive"), api_branch(case, "negative")
    plain = kv_bytes((CondEntry(pos[0].cond),), None, 1.0)  # "sky" over the whole image: 5 text + 6x8 image tokens
    regions = kv_bytes(pos, neg, case["cfg"])
    # Streams: sky over its 12x6 area (5 text + 6x3 tokens), tree over 6x8 (4 + 3x4), river masked over the
    # whole image (5 + 48), the negative (3 + 48) and its partners over the two areas (3 + 18, 3 + 12).
    tokens = (5 + 18) + (4 + 12) + (5 + 48) + (3 + 48) + (3 + 18) + (3 + 12)
    assert regions * (5 + 48) == plain * tokens


# -- the weighing itself, against formulas -------------------------------------------------------------------
def test_area_weight_ramps_only_inside_the_latent():
    """A window's weight is its strength, ramped linearly over min(8, size // 4) pixels on the edges that lie
    inside the latent; the edges on the latent's border stay at full weight."""
    where = place(Region(area=(12, 20, 0, 4)), 0.5, (1, 1, 16, 32))
    assert (where.rows, where.cols) == ((0, 12), (4, 24))
    w = where.weight[0, 0]
    ramp_rows = [(t + 1) / 3 * 0.5 for t in range(3)]  # 12 // 4 = 3 rows at the bottom edge (inside)
    torch.testing.assert_close(w[-3:, 10], torch.tensor(ramp_rows[::-1]))
    assert float(w[0, 10]) == 0.5  # the top edge is the latent's
    ramp_cols = [(t + 1) / 5 * 0.5 for t in range(5)]  # 20 // 4 = 5 columns, both sides inside
    torch.testing.assert_close(w[6, :5], torch.tensor(ramp_cols))
    torch.testing.assert_close(w[6, -5:], torch.tensor(ramp_cols[::-1]))


def test_mask_bounds_and_percentage_areas():
    mask = torch.zeros(1, 16, 16)
    mask[0, 5:7, 3:13] = 1.0
    bounds = place(Region(mask=mask, set_area_to_bounds=True, mask_strength=0.5), 2.0, (1, 1, 16, 16))
    assert (bounds.rows, bounds.cols) == ((5, 13), (3, 13))  # height raised to 8
    torch.testing.assert_close(bounds.weight[0, 0, :2], torch.ones(2, 10))  # mask * 0.5 * 2
    half = place(Region(area_fraction=(1.0, 0.5, 0.0, 0.5)), 1.0, (1, 1, 10, 10))
    assert (half.rows, half.cols) == ((0, 10), (5, 10))


def test_areas_get_partners_in_the_other_branch():
    cond = Conditioning(torch.zeros(1, 2, 4))
    pos = [CondEntry(cond, region=Region(area=(4, 4, 0, 0)))]
    neg = [CondEntry(Conditioning(torch.ones(1, 2, 4)))]
    pos_out, neg_out = pair_areas([pos, neg], (8, 8))
    assert len(pos_out) == 1 and len(neg_out) == 2
    assert neg_out[1].region is pos[0].region and neg_out[1].cond is neg[0].cond


def test_area_outside_the_latent_is_refused():
    with pytest.raises(ConfigError, match="outside the latent"):
        place(Region(area=(4, 4, 16, 0)), 1.0, (1, 1, 16, 16))
