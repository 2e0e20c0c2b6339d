"""Shape buckets: the fixed grid of (rows, width) batch shapes a device runs, so every shape is seen before traffic.

The CUDA provider pays 80-300 ms the first time it meets an input shape (cuDNN attention plans, kernel choice, a
CUDA graph capture) and ~2-4 ms after. A batcher that makes a new (rows, width) pair almost every batch pays
that nearly every time. Padding each batch up to the next shape of a small grid, and running every shape of
the grid once before the server says ready, turns those costs into start-up time.

Rows go to the next power of two up to 32, then to the next multiple of 32 (the largest bucket is `max_rows`),
width to the next multiple of `width_step` (the largest is `max_width`). Only shapes whose padded tokens fit
`max_tokens` are in the grid: the batcher's budget is checked against the bucket's padded cost, so a batch never
needs a shape outside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

ROW_STEP = 32


@dataclass(frozen=True)
class ShapeGrid:
    max_rows: int
    max_width: int
    max_tokens: int
    width_step: int = 16

    def __post_init__(self) -> None:
        if min(self.max_rows, self.max_width, self.max_tokens, self.width_step) < 1:
            raise ValueError(f"every bound of a shape grid must be positive: {self}")
        if self.max_width > self.max_tokens:
            raise ValueError(f"a full-width row ({self.max_width}) exceeds the token budget ({self.max_tokens})")

    @cached_property
    def row_sizes(self) -> tuple[int, ...]:
        """Powers of two up to 32, then every multiple of 32: a batch of 100 rows pays for 128, not 128 for 65."""
        sizes, size = [], 1
        while size < min(self.max_rows, ROW_STEP):
            sizes.append(size)
            size *= 2
        sizes.extend(range(ROW_STEP, self.max_rows, ROW_STEP))
        return (*sizes, self.max_rows)

    @cached_property
    def widths(self) -> tuple[int, ...]:
        steps = range(self.width_step, self.max_width, self.width_step)
        return (*steps, self.max_width)

    def rows_for(self, count: int) -> int:
        """The bucket's row count for a batch of `count` rows."""
        if not 1 <= count <= self.max_rows:
            raise ValueError(f"{count} rows is outside the grid (1..{self.max_rows})")
        return next(size for size in self.row_sizes if size >= count)

    def width_for(self, width: int) -> int:
        """The bucket's width for a batch whose longest row has `width` tokens."""
        if not 1 <= width <= self.max_width:
            raise ValueError(f"width {width} is outside the grid (1..{self.max_width})")
        return next(w for w in self.widths if w >= width)

    def bucket(self, count: int, width: int) -> tuple[int, int]:
        return self.rows_for(count), self.width_for(width)

    def padded_cost(self, count: int, width: int) -> int:
        """Padded tokens that a batch of `count` rows, the longest `width` long, really costs on this grid.

        Past the grid the cost is reported as over the budget, so a batcher never forms such a batch."""
        if count > self.max_rows or width > self.max_width:
            return self.max_tokens + 1
        rows, padded_width = self.bucket(count, width)
        return rows * padded_width

    @cached_property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Every bucket a batch can land in, smallest first: what warm-up must run."""
        return tuple(
            (rows, width) for rows in self.row_sizes for width in self.widths if rows * width <= self.max_tokens
        )
