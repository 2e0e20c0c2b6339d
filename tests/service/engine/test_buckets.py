"""Shape buckets: which bucket a batch lands in, and that the grid covers every batch a batcher can form."""

from __future__ import annotations

import pytest

from service.engine.buckets import ShapeGrid


def test_rows_go_to_powers_of_two_then_multiples_of_32_and_widths_to_the_step() -> None:
    assert ShapeGrid(max_rows=130, max_width=64, max_tokens=8192).row_sizes == (1, 2, 4, 8, 16, 32, 64, 96, 128, 130)
    assert ShapeGrid(max_rows=32, max_width=64, max_tokens=8192).row_sizes == (1, 2, 4, 8, 16, 32)

    grid = ShapeGrid(max_rows=24, max_width=100, max_tokens=1024, width_step=16)
    assert grid.row_sizes == (1, 2, 4, 8, 16, 24)
    assert grid.widths == (16, 32, 48, 64, 80, 96, 100)
    assert grid.bucket(1, 1) == (1, 16)
    assert grid.bucket(3, 17) == (4, 32)
    assert grid.bucket(17, 96) == (24, 96)
    assert grid.bucket(24, 97) == (24, 100)


def test_the_width_step_doubles_every_8_widths_so_padding_is_under_a_step_then_under_a_quarter() -> None:
    grid = ShapeGrid(max_rows=256, max_width=512, max_tokens=16384, width_step=8)
    assert grid.widths == (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
    assert grid.bucket(3, 17) == (4, 24)  # a fixed step of 16 paid for 32
    assert grid.bucket(100, 65) == (128, 80)
    for width in range(9, 513):  # under one step of 8 up to 64 (9 -> 16: +78%), then under a quarter more
        padded = grid.width_for(width)
        assert (padded - width < 8) if width <= 64 else (padded < 1.25 * width), width
    coarse = ShapeGrid(max_rows=8, max_width=300, max_tokens=4096, width_step=16)
    assert coarse.widths == (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 300)


def test_outside_the_grid_is_refused_and_costs_more_than_the_budget() -> None:
    grid = ShapeGrid(max_rows=8, max_width=64, max_tokens=256)
    with pytest.raises(ValueError):
        grid.bucket(9, 10)
    with pytest.raises(ValueError):
        grid.bucket(1, 65)
    assert grid.padded_cost(9, 10) > 256 and grid.padded_cost(1, 65) > 256
    assert grid.padded_cost(5, 20) == 8 * 32  # the bucket's cost, not the batch's own 5 x 20
    with pytest.raises(ValueError, match="exceeds the token budget"):
        ShapeGrid(max_rows=8, max_width=512, max_tokens=256)


@pytest.mark.parametrize(
    ("max_rows", "max_width", "max_tokens", "step"),
    [(32, 512, 8192, 16), (256, 512, 16384, 16), (7, 100, 300, 10), (1, 128, 128, 32)],
)
def test_every_batch_within_the_budget_lands_in_a_warmed_shape(max_rows, max_width, max_tokens, step) -> None:
    grid = ShapeGrid(max_rows=max_rows, max_width=max_width, max_tokens=max_tokens, width_step=step)
    warmed = set(grid.shapes)
    assert len(warmed) == len(grid.shapes)
    for count in range(1, max_rows + 1):
        for width in range(1, max_width + 1):
            if grid.padded_cost(count, width) <= max_tokens:  # what a batcher on this grid may form
                assert grid.bucket(count, width) in warmed, (count, width)
    assert all(rows * width <= max_tokens for rows, width in warmed)
    assert (1, max_width) in warmed  # a single full-length row always fits
