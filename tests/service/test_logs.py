"""service.logs: the text format's time, made once a second, reads as logging's own; with traces on, each line
names the trace and span it was logged in."""

from __future__ import annotations

import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from service.logs import TEXT_FORMAT, JsonAccessFormatter, RequestIdFilter, TextFormatter


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


def test_a_line_logged_in_a_sampled_span_names_its_trace_and_span() -> None:
    traced = TextFormatter(traced=True)
    provider = TracerProvider()
    span = provider.get_tracer("test").start_span("request")
    ids = span.get_span_context()

    def line(access: bool = False) -> logging.LogRecord:
        record = logging.LogRecord("service.access", logging.INFO, __file__, 1, "POST /x %d", (200,), None)
        if access:
            record.access = {"status": 200}
        RequestIdFilter(traced=True).filter(record)
        return record

    with trace.use_span(span, end_on_exit=True):
        inside, inside_json = line(), line(access=True)
    outside = line()
    assert f"trace_id={ids.trace_id:032x} span_id={ids.span_id:016x}]" in traced.format(inside)
    assert "[- trace_id=- span_id=-]" in traced.format(outside)
    entry = json.loads(JsonAccessFormatter().format(inside_json))
    assert (entry["trace_id"], entry["span_id"]) == (f"{ids.trace_id:032x}", f"{ids.span_id:016x}")
    assert json.loads(JsonAccessFormatter().format(outside))["trace_id"] is None
    untraced = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    RequestIdFilter().filter(untraced)  # traces off: no trace fields at all, the JSON line as it always was
    assert not hasattr(untraced, "trace_id") and "trace_id" not in json.loads(JsonAccessFormatter().format(untraced))
