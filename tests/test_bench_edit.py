"""bench edit runs end to end (quick mode) and reports what it says it measures."""

from __future__ import annotations

from parallel_runtime.tools import bench_edit
from parallel_runtime.tools.cli import BENCHES


def test_bench_edit_quick_reports_both_layouts():
    assert BENCHES["edit"][0] == "bench_edit"
    result = bench_edit.run(quick=True)
    for name in ("edit_1rank", "plain_1rank", "edit_ulysses2"):
        assert result[f"{name}_step_s"] > 0
    assert result["speedup"] == result["edit_1rank_step_s"] / result["edit_ulysses2_step_s"]
    assert "reference tokens" in result["image"] and result["model"] and result["baseline"]
