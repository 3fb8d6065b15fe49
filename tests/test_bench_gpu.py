"""``bench gpu``: the model of N GPUs against the bytes our collectives count and brute force, and
the CPU fallback run end to end (the smoke mode CI runs without a GPU)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch

from parallel_runtime.parallel.config import ParallelConfig
from parallel_runtime.tools import gpu_model
from parallel_runtime.tools.gpu_model import Profile
from tests.dist_jobs import attention_jobs


def _profile(blocks=(1.0, 2.0, 3.0, 1.0, 1.0, 4.0), image=48, text=16, hidden=32, layers=1) -> Profile:
    return Profile(
        step_seconds=sum(blocks) + 0.5 + 0.25,
        block_seconds=tuple(blocks),
        embed_seconds=0.5,
        final_seconds=0.25,
        element_bytes=4,
        batch=2,
        image_tokens=image,
        text_tokens=text,
        hidden=hidden,
        attention_layers=layers,
        boundary_image_bytes=4 * 2 * image * hidden,
        boundary_item_bytes=4 * 2 * text * hidden + 4 * 2 * hidden,
        prediction_bytes=4 * 2 * 16 * 8 * 8,
    )


@pytest.mark.parametrize("dim", ["ulysses", "ring"])
def test_modelled_bytes_equal_what_the_collectives_send(cpu_pool, dim):
    """The model's per-layer bytes are the bytes our USP attention counts on 2 real ranks."""
    pool = cpu_pool(ParallelConfig(**{dim: 2}))
    b, heads, seq, d = 2, 4, 64, 8
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(b, heads, seq, d, generator=gen) for _ in range(3))
    outs = pool.submit(attention_jobs.run_usp, q, k, v, result_rank="all").result(120)
    prof = _profile(image=48, text=16, hidden=heads * d)  # sequence 64 = 48 image + 16 text
    modelled = (gpu_model.ulysses_bytes if dim == "ulysses" else gpu_model.ring_bytes)(prof, 2)
    assert all(sent[dim] == modelled for _, sent in outs), (outs[0][1], modelled)


def test_balanced_stages_are_the_best_contiguous_split():
    blocks = (1.0, 2.0, 3.0, 1.0, 1.0, 4.0, 0.5)
    for n in (2, 3, 4):
        counts = gpu_model.balanced_counts(blocks, n)
        assert sum(counts) == len(blocks) and all(c >= 1 for c in counts)
        brute = min(  # every way of cutting the blocks into n contiguous non-empty stages
            max(sum(blocks[a:b]) for a, b in zip((0, *cuts), (*cuts, len(blocks))))
            for cuts in itertools.combinations(range(1, len(blocks)), n - 1)
        )
        starts = _starts(counts)
        assert max(sum(blocks[a:b]) for a, b in zip(starts, starts[1:])) == brute, (n, counts)


def _starts(counts):
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def test_layouts_model_compute_split_plus_bytes_over_the_link():
    prof = _profile()
    steps = 10
    out = gpu_model.model_layouts(prof, steps, gpus=(2, 4), warmup=1, token_rows=8)
    for link, bandwidth in gpu_model.LINKS.items():
        uly = out[link]["ulysses"]["4"]
        assert uly == pytest.approx(steps * (prof.step_seconds / 4 + gpu_model.ulysses_bytes(prof, 4) / bandwidth))
        cfg = out[link]["cfg2_x_ulysses"]["2"]  # one branch per GPU, then the predictions cross once
        assert cfg == pytest.approx(steps * (prof.step_seconds + prof.prediction_bytes / bandwidth))
        # PipeFusion on 2 stages of equal block counts: blocks 1+2+3 (+ embed) and 1+1+4 (+ final).
        stages = [6.5, 6.25]
        patches = 4  # two per stage
        expected = (
            1 * (sum(stages) + (prof.boundary_image_bytes + prof.boundary_item_bytes) / bandwidth)
            + (steps - 1)
            * max(max(stages), (prof.boundary_image_bytes + patches * prof.boundary_item_bytes) / bandwidth)
            + max(stages) / patches
        )
        assert out[link]["pipefusion"]["2"] == pytest.approx(expected)
        assert out[link]["pipefusion_balanced"]["2"] <= out[link]["pipefusion"]["2"]
    # A slower link can only cost time.
    assert out["pcie4_x16"]["ulysses"]["2"] > out["nvlink"]["ulysses"]["2"]


def test_cpu_fallback_runs_and_names_what_it_measured(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_runtime", "bench", "gpu", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    if res["fallback"]:
        assert "fallback" in res["device"] and "CPU fallback" in res["model"]
    for key in ("device", "config", "step_seconds", "diffusers_step_seconds", "attention_backend", "model", "baseline"):
        assert res[key], key
    assert res["step_ratio_vs_diffusers"] == pytest.approx(res["step_seconds"] / res["diffusers_step_seconds"])
    assert res["config"]["num_layers"] + res["config"]["num_single_layers"] == len(res["block_seconds_measured"])
    assert set(res["modelled"]) == {"nvlink", "pcie4_x16"}
    for layouts in res["modelled"].values():
        for layout in ("ulysses", "ring", "cfg2_x_ulysses", "pipefusion"):
            assert set(layouts[layout]) >= {"2", "4"} and all(s > 0 for s in layouts[layout].values()), layout


def test_gpu_speed_cpu_fallback_measures_steps_and_reused_steps(tmp_path):
    """``bench gpu-speed --quick`` (without a GPU: SDPA, eager, float32 and fp8-stored blocks)."""
    out = tmp_path / "gpu_speed.json"
    proc = subprocess.run(
        [sys.executable, "-m", "parallel_runtime", "bench", "gpu-speed", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in ("model", "baseline", "device", "auto_kernel", "variants"):
        assert res[key], key
    wide = "fp32" if res["fallback"] else "bf16"
    if res["fallback"]:
        assert set(res["variants"]) == {"sdpa eager fp32", "sdpa eager fp8"}
        assert res["auto_kernel"].startswith("sdpa")
    base = res["variants"][f"sdpa eager {wide}"]
    assert base["error_vs_eager_sdpa"] == 0.0
    assert 0.0 < base["reused_over_step"] < 1.0  # a reused step skips every block but the first
    fp8 = res["variants"]["sdpa eager fp8"]
    assert 0.0 < fp8["error_vs_eager_sdpa"] < 0.1  # fp8 weights: close, not equal
    assert res["fp8_layers"] > 0
