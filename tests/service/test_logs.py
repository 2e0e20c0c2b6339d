"""service.logs: the text format's time, made once a second, reads as logging's own; with traces on, each line
names the trace and span it was logged in; an access line written without a record reads as the record's would,
and where anything else would see the record, it is made."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from service.logs import (
    TEXT_FORMAT,
    JsonAccessFormatter,
    RequestIdFilter,
    TextFormatter,
    access_log,
    configure_logging,
    direct_access_handler,
    log_access,
)


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


@pytest.fixture
def configured() -> Iterator[Callable[..., io.StringIO]]:
    """`configure_logging` as the server calls it, its handler writing to a buffer, and no other handler (pytest's
    captures set aside for the test); logging as it was afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, access_log.handlers[:], access_log.propagate, access_log.disabled)

    def configure(access: str, traced: bool = False) -> io.StringIO:
        configure_logging("info", access, traced)
        root.handlers[:] = [handler for handler in root.handlers if getattr(handler, "bertserve", False)]
        buffer = io.StringIO()
        for handler in [*root.handlers, *access_log.handlers]:
            if getattr(handler, "bertserve", False):
                handler.setStream(buffer)  # type: ignore[attr-defined]
        return buffer

    yield configure
    root.handlers[:], access_log.handlers[:] = saved[0], saved[2]
    root.setLevel(saved[1])
    access_log.propagate, access_log.disabled = saved[3], saved[4]


# A client's path may hold quotes, a newline, non-ASCII: JSON-quoted in the text line, escaped in the JSON one
ACCESS_CALLS = [
    ("3f2a", "POST", "/v1/models/sst2/classify", 200, 0.00451, ("127.0.0.1", 57620), None),
    ("b" * 128, "POST", '/v1/models/x"y\n2026-01-01 forged/ner', 404, 0.0, None, None),
    ("c", None, None, 408, 12.345678, ("::1", 9), None),
    ("d", "POST", "/inference.GRPCInferenceService/ModelInfer", 503, 1.0049, ("10.0.0.2", 1), "mod\u00e9le"),
]
TIME_TEXT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def _logged_both_ways(buffer: io.StringIO) -> tuple[list[str], list[str]]:
    """Each call's line written directly, then through logging's records (a filter on the access logger, which
    passes everything, puts them there)."""
    assert direct_access_handler() is not None
    for call in ACCESS_CALLS:
        log_access(*call)
    direct = buffer.getvalue().splitlines()
    buffer.seek(0)
    buffer.truncate()
    passing = logging.Filter()
    access_log.addFilter(passing)
    try:
        assert direct_access_handler() is None
        for call in ACCESS_CALLS:
            log_access(*call)
    finally:
        access_log.removeFilter(passing)
    return direct, buffer.getvalue().splitlines()


def test_an_access_line_written_directly_reads_as_its_record_would(configured: Callable[..., io.StringIO]) -> None:
    direct, recorded = _logged_both_ways(configured("text"))
    assert len(direct) == len(recorded) == len(ACCESS_CALLS)
    for ours, theirs in zip(direct, recorded, strict=True):
        assert TIME_TEXT.match(ours) and TIME_TEXT.match(theirs)
        assert ours[24:] == theirs[24:]
    assert direct[0].endswith(
        ' INFO service.access [3f2a]: 127.0.0.1:57620 "POST /v1/models/sst2/classify" 200 4.51 ms'
    )


def test_a_json_access_line_written_directly_reads_as_its_record_would(
    configured: Callable[..., io.StringIO],
) -> None:
    direct, recorded = _logged_both_ways(configured("json"))
    assert len(direct) == len(recorded) == len(ACCESS_CALLS)
    for ours, theirs in zip(direct, recorded, strict=True):
        ours_entry, theirs_entry = json.loads(ours), json.loads(theirs)
        assert ours.isascii() and list(ours_entry) == list(theirs_entry)  # the same keys in the same order
        assert datetime.fromisoformat(ours_entry.pop("ts")).tzinfo is not None
        theirs_entry.pop("ts")
        assert ours_entry == theirs_entry
    assert json.loads(direct[3])["model"] == "mod\u00e9le" and json.loads(direct[0])["model"] == "sst2"


def test_anything_else_that_would_see_an_access_record_still_sees_it(
    configured: Callable[..., io.StringIO],
) -> None:
    buffer = configured("text")
    seen: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    extra = Capture()
    for logger in (logging.getLogger(), logging.getLogger("service"), access_log):  # a capture at any level
        logger.addHandler(extra)
        try:
            assert direct_access_handler() is None
            log_access(*ACCESS_CALLS[0])
        finally:
            logger.removeHandler(extra)
    assert [record.getMessage() for record in seen] == [seen[0].getMessage()] * 3
    assert seen[0].access["status"] == 200 and seen[0].request_id == "3f2a"  # type: ignore[attr-defined]
    assert len(buffer.getvalue().splitlines()) == 3  # and the server's own handler wrote each line once
    configured("text", True)  # traced: the line names the span from the record's context
    assert direct_access_handler() is None
    configured("off")
    assert not access_log.isEnabledFor(logging.INFO)


def test_an_access_line_that_cannot_be_written_is_reported_as_logging_reports_it(
    configured: Callable[..., io.StringIO], capsys: pytest.CaptureFixture[str]
) -> None:
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("stderr is gone")

    configured("text")
    handler = direct_access_handler()
    assert handler is not None
    handler.setStream(Closed())
    log_access(*ACCESS_CALLS[0])  # not raised into the request that is being answered
    reported = capsys.readouterr().err
    assert "--- Logging error ---" in reported and "OSError: stderr is gone" in reported
    assert '"POST /v1/models/sst2/classify" 200 4.51 ms' in reported
