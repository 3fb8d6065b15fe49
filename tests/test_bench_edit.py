"""bench edit runs end to end (quick mode), interleaved, and reports what it says it measures."""

from __future__ import annotations

from parallel_runtime.tools import bench_edit
from parallel_runtime.tools.cli import BENCHES


def test_bench_edit_quick_reports_every_layout_interleaved():
    assert BENCHES["edit"][0] == "bench_edit"
    result = bench_edit.run(quick=True)
    seconds = result["seconds_per_step"]
    assert set(seconds) == {bench_edit.BASELINE, bench_edit.ULYSSES, bench_edit.PLAIN, *bench_edit.PF_MODES}
    for summary in seconds.values():
        assert summary["median"] > 0 and summary["n"] == result["repeats"]
    speedup = result["speedup_ulysses2"]
    assert speedup["baseline"] == bench_edit.BASELINE
    assert speedup["median"] == seconds[bench_edit.BASELINE]["median"] / seconds[bench_edit.ULYSSES]["median"]
    sequence = result["sequence"]
    assert sequence["reference_tokens"] == sequence["image_tokens"] > 0
    assert sequence["image_plus_reference_tokens"] == 2 * sequence["image_tokens"]
    assert result["model"] and result["config"] and bench_edit.BASELINE in result["baseline"]
    # PipeFusion's reference K/V: each stage ran the reference tokens in the warmup step, then once per step (the
    # default), once per patch (recomputed) or never again (kept); every mode near the 1-rank result
    kv = result["pipefusion_reference_kv"]
    assert kv["measured"] is True and kv["saving"]["baseline"] == bench_edit.PF_RECOMPUTED
    runs = kv["reference_tokens_per_stage"]
    per_step, redone, kept = runs[bench_edit.PF_PER_STEP], runs[bench_edit.PF_RECOMPUTED], runs[bench_edit.PF_KEPT]
    steps, patches = result["steps_per_job"], kv["patches"]
    for stage in range(2):
        once = kept[stage]  # the warmup step's
        assert once > 0 and per_step[stage] == once * steps and redone[stage] == once * (1 + patches * (steps - 1))
    assert all(0 < e < 0.05 for e in kv["relative_error_vs_1rank"].values()), kv["relative_error_vs_1rank"]
