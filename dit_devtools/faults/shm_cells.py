"""The fault matrix's full-/dev/shm cells, run in a private mount namespace.

A cell's rank fills /dev/shm to the last byte at the phase's point (injection.py); the job must
still work — its messages larger than a ring slot go through the pool's private folder — with a
warning naming /dev/shm and docker's ``--shm-size``, and the next job too. Filling the machine's
real /dev/shm would break every other program using it, so the cells run in a child process with a
small tmpfs of its own over /dev/shm (``unshare -m``, which needs root); elsewhere every cell is
reported "not applicable" with the reason. Messages must exceed a slot (64 KiB), so the images are
256x256 (a 64 KiB latent, a 768 KiB decoded image).

``python -m dit_devtools.faults.shm_cells CELL...`` runs the named cells here (inside the
namespace) and prints one JSON line per result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .matrix import NEEDS_NAMESPACE, PHASES, Cell, CellResult, Matrix

SHM_MIB = 64  # Docker's default /dev/shm
IMAGE_SIDE = 256
CHILD_TIMEOUT_S = 1800
CHECKOUT = Path(__file__).resolve().parents[2]


def shm_cells(world: int = 2) -> list[Cell]:
    return [Cell(p, "shm-full", r) for p in PHASES for r in range(world)]


def namespace_problem() -> str | None:
    """None when this process can mount a tmpfs in a private mount namespace, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, text=True
    )
    return None if probe.returncode == 0 else f"mount failed: {probe.stderr.strip()[:200]}"


def run_shm_cells(cells: Sequence[Cell]) -> list[CellResult]:
    """Run ``cells`` in a child with a private ``SHM_MIB`` MiB /dev/shm (not-applicable results
    when that is impossible here)."""
    applicable = [c for c in cells if c.not_applicable() is None]
    problem = namespace_problem() if applicable else None
    if problem is not None:
        return [
            CellResult(
                c.name,
                f"not applicable: {c.not_applicable()}" if c.not_applicable() else f"{NEEDS_NAMESPACE}: {problem}",
            )
            for c in cells
        ]
    names = [c.name for c in cells]
    inner = " ".join([shlex.quote(sys.executable), "-m", "dit_devtools.faults.shm_cells", *map(shlex.quote, names)])
    script = f"mount -t tmpfs -o size={SHM_MIB}m tmpfs /dev/shm && exec {inner}"
    proc = subprocess.run(  # from the checkout's root, where python -m finds dit_devtools and parallel_runtime
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, cwd=CHECKOUT
    )
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            data = json.loads(line)
            found[data["cell"]] = CellResult(**data)
    tail = (proc.stderr or proc.stdout)[-500:]
    return [
        found.get(n) or CellResult(n, "fail", problems=[f"the child gave no result (rc {proc.returncode}): {tail}"])
        for n in names
    ]


def _parse(name: str) -> Cell:
    phase, fault, rank = name.split(".")
    return Cell(phase, fault, int(rank.removeprefix("rank")))


def main(argv: list[str]) -> int:
    import torch

    torch.set_num_threads(1)
    matrix = Matrix(size=IMAGE_SIDE)
    try:
        for name in argv:
            result = matrix.run(_parse(name))
            print(json.dumps(dataclasses.asdict(result)), flush=True)
    finally:
        matrix.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
