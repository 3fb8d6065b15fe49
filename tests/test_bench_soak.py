"""``bench soak``'s core at a tiny size: the JSON names its model and figures, resources are sampled
on the schedule, slopes are least-squares fits, latencies per job kind. No timed assertions."""

from __future__ import annotations

import json
import os

import pytest

from parallel_runtime.tools.bench_soak import percentile, resource_sample, slope_per_1000, soak
from parallel_runtime.tools.report import check_result, emit


def test_slope_is_the_least_squares_fit_per_1000_jobs():
    xs = [10, 20, 30, 40]
    assert slope_per_1000(xs, [5.0 + 0.002 * x for x in xs]) == pytest.approx(2.0)
    assert slope_per_1000(xs, [1.0, 3.0, 1.0, 3.0]) == pytest.approx(1000 * 0.04)  # 2/50 per job
    assert slope_per_1000([10], [1.0]) is None and slope_per_1000([5, 5], [1.0, 2.0]) is None


def test_percentiles():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 51.0
    assert percentile(values, 0.99) == 99.0 and percentile([3.0], 0.99) == 3.0


def test_resource_sample_reads_this_process():
    s = resource_sample([os.getpid()])
    assert s["host"]["rss_mib"] > 10 and s["host"]["fds"] >= 3 and s["host"]["threads"] >= 1
    assert s["workers"] == s["host"] or abs(s["workers"]["rss_mib"] - s["host"]["rss_mib"]) < 50
    assert set(s["shm"]) == {"shm_entries", "shm_mib"}


def test_soak_reports_slopes_latencies_and_names_its_model(tmp_path, capsys):
    result = soak(jobs=24, sample_every=4, seed=1)
    check_result(result)  # names the model config and the baseline
    assert "tiny-flux" in result["model"] and "Ulysses" in result["model"]
    assert [s["jobs"] for s in result["samples"]] == [4, 8, 12, 16, 20, 24]
    for who in ("host", "workers"):
        assert set(result["slopes_per_1000_jobs"][who]) == {"rss_mib", "fds", "threads"}
        assert all(isinstance(v, float) for v in result["slopes_per_1000_jobs"][who].values())
    assert set(result["slopes_per_1000_jobs"]["shm"]) == {"shm_entries", "shm_mib"}
    assert result["samples"][0]["workers"]["rss_mib"] > 0  # two workers' memory, not the host's
    assert sum(k["n"] for k in result["latency_s"].values()) == 24
    assert all(k["p50"] <= k["p99"] for k in result["latency_s"].values())
    assert result["pool_restarts"] == {"usp": 0, "cfg=2": 0, "pp=2": 0}
    emit(result, "soak", str(tmp_path / "soak.json"))
    written = json.loads((tmp_path / "soak.json").read_text())
    assert written["jobs"] == 24 and "slopes_per_1000_jobs" in written and "machine" in written
    assert "slopes_per_1000_jobs.host.rss_mib" in capsys.readouterr().out


def test_no_matrix_only_for_soak(capsys):
    from parallel_runtime.tools.cli import main

    assert main(["bench", "runtime", "--no-matrix"]) == 2
    assert "--no-matrix" in capsys.readouterr().err
