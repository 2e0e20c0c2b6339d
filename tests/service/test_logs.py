"""service.logs: the text format's time, made once a second, reads as logging's own."""

from __future__ import annotations

import logging

import pytest

from service.logs import TEXT_FORMAT, TextFormatter


@pytest.mark.parametrize(
    "created",
    [1764196573.0, 1764196573.0004, 1764196573.9996, 1764196574.0, 1764196574.5, 1764196573.25, 1764283000.123],
)
def test_each_line_reads_as_the_standard_formatter_writes_it(created: float) -> None:
    ours, standard = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    for moment in (created - 1.0, created, created):  # a second before, then this one twice (the cached text)
        record = logging.LogRecord("service.access", logging.INFO, __file__, 1, "%s %d", ("POST /x", 200), None)
        record.request_id = "abc"
        record.created = moment
        record.msecs = int((moment - int(moment)) * 1000) + 0.0
        assert ours.format(record) == standard.format(record)
