"""Row bands of an image split over the ranks of a process group (for the parallel VAE decode).

A :class:`RowBands` says how many rows each group rank holds at the current resolution. Ranks
holding 0 rows "sit out": they own no pixels but still join every collective with empty
contributions, so nobody waits on them and nothing deadlocks. Active ranks are always a prefix
of the group (rank 0 .. active-1), top band first.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from ..errors import ConfigError
from ..parallel.mesh import CommStats
from ..parallel.sharding import split_sizes

DEFAULT_MIN_BAND_ROWS = 2
"""Default fewest latent rows a rank decodes. One row is enough for correctness (every 3x3 conv
needs one halo row), but a 1-row band spends twice its own size on halo rows in the first layers,
so below 2 rows a rank costs more in traffic than it saves in compute."""


@dataclasses.dataclass(frozen=True)
class RowBands:
    """Rows per group rank at one resolution, plus this rank's place and its process group."""

    rows: tuple[int, ...]
    rank: int
    group: dist.ProcessGroup | None
    stats: CommStats

    @property
    def height(self) -> int:
        return sum(self.rows)

    @property
    def active(self) -> int:
        """Number of ranks holding at least one row (they are ranks 0 .. active-1)."""
        return sum(1 for r in self.rows if r > 0)

    @property
    def local_rows(self) -> int:
        return self.rows[self.rank]

    @property
    def offset(self) -> int:
        """First image row of this rank's band."""
        return sum(self.rows[: self.rank])

    @property
    def up(self) -> int | None:
        """Group rank holding the band above this one, None at the top border or when sitting out."""
        return self.rank - 1 if self.local_rows > 0 and self.rank > 0 else None

    @property
    def down(self) -> int | None:
        """Group rank holding the band below this one, None at the bottom border or when sitting out."""
        return self.rank + 1 if self.local_rows > 0 and self.rank + 1 < self.active else None

    def scaled(self, factor: int) -> RowBands:
        """The same split after an integer upsampling of the rows (every band grows by ``factor``)."""
        return dataclasses.replace(self, rows=tuple(r * factor for r in self.rows))


def plan_band_rows(height: int, ranks: int, min_rows: int) -> tuple[int, ...]:
    """Split ``height`` latent rows over ``ranks`` with no band thinner than ``min_rows``.

    Uses as many ranks as fit (``height // min_rows``, at least 1); the rest get 0 rows."""
    if height < 1 or ranks < 1 or min_rows < 1:
        raise ConfigError(
            f"cannot split {height} latent rows over {ranks} rank(s) with bands of at least {min_rows} row(s)",
            "the latent height, the rank count and the minimum band height must all be at least 1",
            "pass a non-empty latent [B, C, h, w] and min_band_rows >= 1",
        )
    active = max(1, min(ranks, height // min_rows))
    return tuple(split_sizes(height, active)) + (0,) * (ranks - active)
