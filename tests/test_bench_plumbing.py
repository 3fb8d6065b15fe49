"""The shared benchmark plumbing: interleaved repeated timing, ratios of medians, the JSON convention."""

from __future__ import annotations

import json

import pytest
import torch

from parallel_runtime.runtime.builtin_jobs import tensor_sink
from parallel_runtime.tools.measure import interleave, ratio
from parallel_runtime.tools.report import check_result, emit


def test_interleave_rotates_the_order_and_skips_warmup_rounds():
    calls: list[str] = []
    seconds = {"a": iter([9.0, 1.0, 2.0, 3.0]), "b": iter([9.0, 2.0, 4.0, 6.0]), "c": iter([9.0, 1.0, 1.0, 1.0])}

    def contender(name):
        def run():
            calls.append(name)
            return next(seconds[name])

        return run

    times = interleave({n: contender(n) for n in "abc"}, repeats=3, warmup=1)
    assert calls == list("abc" + "bca" + "cab" + "abc")  # each round starts one further along
    assert times["a"].values == (1.0, 2.0, 3.0)  # the warmup round's 9.0 is dropped
    assert times["b"].median == 4.0 and times["b"].spread == pytest.approx((6 - 2) / 4)
    assert times["c"].summary() == {"median": 1.0, "min": 1.0, "max": 1.0, "spread": 0.0, "n": 3}


def test_ratio_is_median_over_median_with_the_paired_range():
    times = interleave({"base": iter([4.0, 40.0, 4.2]).__next__, "fast": iter([2.0, 2.1, 2.0]).__next__}, repeats=3)
    r = ratio(times, "base", "fast")
    # One disturbed baseline round (40 s) moves neither the median nor the ratio of medians.
    assert r["median"] == pytest.approx(4.2 / 2.0)
    assert r["paired_min"] == pytest.approx(2.0) and r["paired_max"] == pytest.approx(40.0 / 2.1)
    assert r["baseline"] == "base"


def test_interleave_times_contenders_that_return_none():
    times = interleave({"x": lambda: None}, repeats=2)
    assert len(times["x"].values) == 2 and all(v >= 0 for v in times["x"].values)


def test_results_must_name_model_and_baseline(tmp_path, capsys):
    with pytest.raises(ValueError, match="model"):
        check_result({"baseline": "1 rank", "speedup": 2.0})
    with pytest.raises(ValueError, match="baseline"):
        emit({"model": "tiny", "speedup": 2.0}, "t", None)
    out = tmp_path / "r.json"
    emit({"model": "tiny flux", "baseline": "1 rank x 1 thread", "speedup": 1.5}, "title", str(out))
    data = json.loads(out.read_text())
    assert data["model"] == "tiny flux" and data["machine"]["cpus"] >= 1
    assert "speedup" in capsys.readouterr().out


def test_tensor_sink_reads_every_byte():
    data = torch.randint(0, 255, (3 * 4096 + 5,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    base = tensor_sink(None, data)
    assert base["nbytes"] == data.numel()
    for at in (0, 1, 4095, 4097, 8191, 3 * 4096 + 2, 3 * 4096 + 4):  # inside words, between 4 KiB pages, the tail
        changed = data.clone()
        changed[at] = (int(changed[at]) + 1) % 256
        assert tensor_sink(None, changed)["checksum"] != base["checksum"], at
    assert tensor_sink(None, data.view(torch.int8).float())["nbytes"] == 4 * data.numel()
    assert tensor_sink(None, torch.empty(0))["checksum"] == 0


def test_model_option_only_for_benches_that_take_it(capsys):
    from parallel_runtime.tools import bench_pipefusion
    from parallel_runtime.tools.cli import main

    assert main(["bench", "vae", "--model", "tiny-flux"]) == 2  # refused before any work
    assert "takes no --model" in capsys.readouterr().err
    names = [m for _, m in bench_pipefusion.ERROR_MODELS]
    assert "tiny-flux" in names  # the random-weight figure every run reports
    assert "tiny-flux-shapes" in names  # ... beside the trained model's


def test_bench_families_gives_every_family_a_widened_model_and_the_same_token_count(tmp_path):
    """``bench families`` measures Ulysses 2 on every family (issue 27): each has a widened tiny config (random prompt
    embeddings of its shapes where no worker encodes its prompts), and a video family's frame side and latent
    frames make the image's token count."""
    from parallel_runtime.checkout import devtools_module
    from parallel_runtime.models.base import Conditioning
    from parallel_runtime.models.families.registry import FAMILIES
    from parallel_runtime.tools.bench_families import PX, bench_size

    tiny = devtools_module("tiny", "test")
    tokens = (PX // 16) ** 2
    for spec in FAMILIES:
        name = tiny.WIDENED_NAMES.get(spec.id, f"tiny-{spec.id}")
        assert name in tiny.WIDENED, spec.id
        prompts = tiny.random_prompts(name)
        if not spec.text_encoding().on_workers:
            assert prompts is not None and all(isinstance(p, Conditioning) for p in prompts), spec.id
            assert not torch.equal(prompts[0].prompt_embeds, prompts[1].prompt_embeds)
        for channels in (16, 48, 128):
            (tmp_path / "transformer").mkdir(exist_ok=True)
            (tmp_path / "transformer" / "config.json").write_text(json.dumps({"out_channels": channels}))
            side, frames = bench_size(spec, tmp_path, PX)
            pixels, frames_per_latent = spec.geometry(channels)
            got = (side // pixels) ** 2 * frames
            assert abs(got - tokens) <= (side // pixels) ** 2 / 2, (spec.id, channels, side, frames)
            if not frames_per_latent:  # an image: the PX square itself
                assert (side, frames) == (PX, 1), (spec.id, side, frames)


def test_bench_latent_has_the_models_latent_shape():
    from parallel_runtime.tools.bench_scaling import bench_latent

    image = {"latent_channels": 16, "spatial_factor": 8, "latent_dims": 2}
    assert bench_latent(image, 512).shape == (1, 16, 64, 64)
    assert bench_latent({**image, "latent_frame_axis": True}, 512).shape == (1, 16, 64, 64)  # ComfyUI's axis only
    video = {"latent_channels": 128, "spatial_factor": 32, "latent_dims": 3}
    assert bench_latent(video, 512, 16).shape == (1, 128, 16, 16, 16)
