"""Shape buckets: the fixed grid of (rows, width) batch shapes a device runs, so every shape is seen before traffic.

The CUDA provider pays 80-300 ms the first time it meets an input shape (cuDNN attention plans, kernel choice, a
CUDA graph capture) and ~2-4 ms after. A batcher that makes a new (rows, width) pair almost every batch pays
that nearly every time. Padding each batch up to the next shape of a small grid, and running every shape of
the grid once before the server says ready, turns those costs into start-up time.

Rows go to the next power of two up to 32, then to the next multiple of 32 (the largest bucket is `max_rows`).
Widths are multiples of `width_step` up to 8 steps, then the step doubles every 8 widths (step 8: 8, 16, ..., 64,
80, ..., 128, 160, ..., 256, 320, ..., 512; the largest is `max_width`): a batch's width is less than one step over
its longest row up to 8 steps (9 -> 16 is +78%, 17 -> 24 +41%), then less than a quarter over it, where a fixed step
of 16 made a batch of 17-token rows pay for 32 (measured: padded / real tokens 1.89 with the fixed step, on
SST-2-like lengths at saturation). Rows pay up to twice over (17 -> 32), and the two multiply: docs/serving.md.
Only shapes whose padded tokens fit `max_tokens` are in the grid: the batcher's budget is checked against the
bucket's padded cost, so a batch never needs a shape outside it.

Lookups are table reads: the batcher asks for the cost of a candidate batch once per row it considers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

ROW_STEP = 32
WIDTHS_PER_STEP = 8  # widths at one step before the step doubles


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
        """Multiples of the step, the step doubling every WIDTHS_PER_STEP widths: relative padding stays bounded."""
        widths, width, step = [], self.width_step, self.width_step
        while width < self.max_width:
            widths.append(width)
            if width >= WIDTHS_PER_STEP * step:
                step *= 2
            width += step
        return (*widths, self.max_width)

    @cached_property
    def _rows_table(self) -> tuple[int, ...]:
        """Index: a batch's row count; value: its bucket's (index 0 unused)."""
        return (0, *(next(size for size in self.row_sizes if size >= count) for count in range(1, self.max_rows + 1)))

    @cached_property
    def _width_table(self) -> tuple[int, ...]:
        return (0, *(next(w for w in self.widths if w >= width) for width in range(1, self.max_width + 1)))

    def rows_for(self, count: int) -> int:
        """The bucket's row count for a batch of `count` rows."""
        if not 1 <= count <= self.max_rows:
            raise ValueError(f"{count} rows is outside the grid (1..{self.max_rows})")
        return self._rows_table[count]

    def width_for(self, width: int) -> int:
        """The bucket's width for a batch whose longest row has `width` tokens."""
        if not 1 <= width <= self.max_width:
            raise ValueError(f"width {width} is outside the grid (1..{self.max_width})")
        return self._width_table[width]

    def bucket(self, count: int, width: int) -> tuple[int, int]:
        return self.rows_for(count), self.width_for(width)

    def padded_cost(self, count: int, width: int) -> int:
        """Padded tokens that a batch of `count` rows, the longest `width` long, really costs on this grid.

        Past the grid the cost is reported as over the budget, so a batcher never forms such a batch."""
        if count > self.max_rows or width > self.max_width:
            return self.max_tokens + 1
        return self._rows_table[count] * self._width_table[width]

    @cached_property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Every bucket a batch can land in, smallest first: what warm-up must run."""
        return tuple(
            (rows, width) for rows in self.row_sizes for width in self.widths if rows * width <= self.max_tokens
        )
