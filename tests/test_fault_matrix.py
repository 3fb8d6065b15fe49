"""The fault matrix's quick subset (the whole matrix runs in ``bench soak``): real CPU worker
processes (gloo) and the tiny-flux model; each cell kills, stops or breaks one rank in one phase
and checks the error (type, rank, within the bound), the next job on the same ParallelModel (same
result as before the fault), and that nothing of a torn-down pool is left."""

from __future__ import annotations

import pytest

from dit_devtools.faults.matrix import (
    BOUND_S,
    FAULTS,
    PHASES,
    QUICK_CELLS,
    STILL_WORKS,
    Cell,
    Matrix,
    all_cells,
    summary,
)
from tests.leftovers import assert_gone


def test_the_quick_subset_covers_every_fault_and_phase_on_both_ranks():
    assert {c.fault for c in QUICK_CELLS} == set(FAULTS)
    assert {c.phase for c in QUICK_CELLS} == set(PHASES)
    assert {c.rank for c in QUICK_CELLS} == {0, 1}
    assert all(c.not_applicable() is None for c in QUICK_CELLS)


def test_cells_that_cannot_happen_are_listed_with_the_reason():
    cells = all_cells()
    assert len(cells) == len(PHASES) * len(FAULTS) * 2
    skipped = {c.name: c.not_applicable() for c in cells if c.not_applicable()}
    assert skipped["encode.nan.rank1"] == "only rank 0 holds the text encoders"
    assert "encode.nan.rank0" not in skipped and "idle.kill.rank0" not in skipped
    assert all(isinstance(why, str) and why for why in skipped.values())


@pytest.fixture(scope="module")
def matrix():
    m = Matrix()
    yield m
    m.close()


@pytest.mark.parametrize("cell", QUICK_CELLS, ids=lambda c: c.name)
def test_fault_cell(matrix, cell: Cell):
    result = matrix.run(cell)
    assert result.outcome == "pass", result
    if cell.fault in STILL_WORKS:  # the job must survive it: no error to detect
        assert result.error == "" and result.note
    else:
        assert result.detection_s is not None and result.detection_s <= BOUND_S  # (load.raise has its own bound)
    assert result.next_job == "same result"
    replaced = result.old_prefix not in {m.pool.shm_prefix for m in matrix.models.values()}
    if replaced:  # the faulted pool was torn down: its processes, segments and folder are gone
        assert_gone(result.old_pids, result.old_prefix, within=5.0)


def test_summary_counts_and_worst_detection():
    from dit_devtools.faults.matrix import CellResult

    results = [
        CellResult("decode.kill.rank0", "pass", detection_s=0.05),
        CellResult("idle.stop.rank1", "pass", detection_s=1.2),
        CellResult("load.stop.rank0", "fail", detection_s=2.5, problems=["x"]),
        CellResult("idle.nan.rank0", "not applicable: no model runs while idle"),
    ]
    s = summary(results)
    assert (s["cells"], s["ran"], s["passed"], s["not_applicable"]) == (4, 3, 2, 1)
    assert s["failed"] == ["load.stop.rank0"]
    assert s["max_detection_s_by_fault"] == {"kill": 0.05, "stop": 2.5}


def test_a_full_dev_shm_cell_runs_in_a_private_namespace_or_says_why_not():
    from dit_devtools.faults.shm_cells import namespace_problem, run_shm_cells

    (result,) = run_shm_cells([Cell("decode", "shm-full", 1)])
    problem = namespace_problem()
    if problem is None:  # root: /dev/shm is a 64 MiB tmpfs of the child's, filled by rank 1 mid-job
        assert result.outcome == "pass", result
        assert result.next_job == "same result" and not any(result.leftovers.values())
        # (whether the 768 KiB image needed a new segment, which then went through the private folder
        # with a warning, or reused a warm one depends on timing: result.note says which; the warning
        # itself is tested in test_shm_full.py)
    else:
        assert (
            result.outcome.startswith("not applicable: needs a private mount namespace") and problem in result.outcome
        )
