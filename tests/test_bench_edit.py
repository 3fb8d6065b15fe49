"""bench edit runs end to end (quick mode), interleaved, and reports what it says it measures."""

from __future__ import annotations

from parallel_runtime.tools import bench_edit
from parallel_runtime.tools.cli import BENCHES


def test_bench_edit_quick_reports_both_layouts_interleaved():
    assert BENCHES["edit"][0] == "bench_edit"
    result = bench_edit.run(quick=True)
    seconds = result["seconds_per_step"]
    assert set(seconds) == {bench_edit.BASELINE, bench_edit.ULYSSES, bench_edit.PLAIN}
    for summary in seconds.values():
        assert summary["median"] > 0 and summary["n"] == result["repeats"]
    speedup = result["speedup_ulysses2"]
    assert speedup["baseline"] == bench_edit.BASELINE
    assert speedup["median"] == seconds[bench_edit.BASELINE]["median"] / seconds[bench_edit.ULYSSES]["median"]
    sequence = result["sequence"]
    assert sequence["reference_tokens"] == sequence["image_tokens"] > 0
    assert sequence["image_plus_reference_tokens"] == 2 * sequence["image_tokens"]
    assert result["model"] and result["config"] and bench_edit.BASELINE in result["baseline"]
    # PipeFusion with reference images is refused on the host today: reported as not measured, with the refusal
    kv = result["pipefusion_reference_kv"]
    assert kv["measured"] is False and "PipeFusion" in kv["reason"] and "reference" in kv["reason"]
