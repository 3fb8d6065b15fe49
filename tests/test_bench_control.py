"""bench control runs end to end (quick mode) and reports what it says it measures; its bytes agree with the
formula for a ControlNet whose tokens stay split (Ulysses 2), and under PipeFusion 2 with the formula for the later
stage's residuals sent once per step."""

from __future__ import annotations

from parallel_runtime.tools import bench_control
from parallel_runtime.tools.cli import BENCHES


def test_bench_control_quick_reports_the_layouts_and_the_bytes_formulas():
    assert BENCHES["control"][0] == "bench_control"
    result = bench_control.run(quick=True)
    assert result["config"] == "flux-union-quick"
    for name in ("control_1rank", "plain_1rank", "control_ulysses2", "plain_ulysses2", "control_pipefusion2"):
        assert result[f"{name}_step_s"] > 0
    share = result["controlnet_share_1rank"]
    assert share == (result["control_1rank_step_s"] - result["plain_1rank_step_s"]) / result["control_1rank_step_s"]
    # quick config: 1 + 1 ControlNet blocks, width 256 (128 per rank's heads), 2 ranks, fp32; 16 text + 1 union
    # tokens split 9 / 8, 64 image tokens 32 / 32: rank 0 holds 41 of 81 tokens, rank 1 40
    rank0 = 2 * 4 * (3 * 41 * 128 + 40 * 128)
    rank1 = 2 * 4 * (3 * 40 * 128 + 41 * 128)
    assert result["controlnet_bytes_per_step_formula"] == [rank0, rank1] == [166912, 164864]
    assert result["controlnet_bytes_per_step_per_rank"] == [rank0, rank1]
    assert result["bytes_match"] is True
    assert bench_control.bytes_formula(16, 64, 256, 3, 2) == [3 * 4 * 4 * 80 * 256 // 4] * 2  # even: 4 e T w / n^2
    # PipeFusion 2: 1 double + 2 single blocks, stage 1 holds 1 (3 blocks: 2 | 1); 64 image tokens, width 256
    assert result["pipefusion_control_bytes_per_step_formula"] == [1 * 64 * 256 * 4, 0]
    assert result["pipefusion_control_bytes_per_step_per_stage"] == [65536, 0]
    assert result["pipefusion_bytes_match"] is True
    assert result["plain_pipefusion2_step_s"] > 0
