"""Request bodies in gzip and deflate: decoded to the byte, within the limit to the byte, bad data named."""

from __future__ import annotations

import gzip
import zlib

import pytest

from service.errors import BadRequest, PayloadTooLarge
from service.frontend.http import content_coding

DATA = b'{"inputs": ["' + b"a gorgeous movie " * 60 + b'"]}'


@pytest.mark.parametrize(
    ("coding", "coded"),
    [
        (b"gzip", gzip.compress(DATA)),
        (b"x-gzip", gzip.compress(DATA)),
        (b"gzip", gzip.compress(DATA[:100]) + gzip.compress(DATA[100:])),
        (b"deflate", zlib.compress(DATA)),
    ],
)
def test_decoded_to_the_byte_and_the_limit_is_exact(coding: bytes, coded: bytes) -> None:
    assert content_coding.decoded(coded, coding, len(DATA)) == DATA
    with pytest.raises(PayloadTooLarge, match=f"more than {len(DATA) - 1} bytes"):
        content_coding.decoded(coded, coding, len(DATA) - 1)


def test_a_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"\0" * 50_000_000)  # ~50 KB
    with pytest.raises(PayloadTooLarge):
        content_coding.decoded(bomb, b"gzip", 1_000_000)


@pytest.mark.parametrize(
    ("coding", "coded", "said"),
    [
        (b"gzip", DATA, "not valid gzip data"),
        (b"deflate", gzip.compress(DATA), "not valid deflate data"),
        (b"gzip", gzip.compress(DATA)[:-4], "stop before their end"),
        (b"deflate", zlib.compress(DATA) + b"more", "4 bytes after its deflate data"),
        (b"gzip", gzip.compress(DATA) + b"more", "not valid gzip data"),
        (b"gzip", b"", "stop before their end"),
    ],
)
def test_bad_data_are_a_bad_request_that_says_why(coding: bytes, coded: bytes, said: str) -> None:
    with pytest.raises(BadRequest, match=said):
        content_coding.decoded(coded, coding, 1_000_000)


def test_codings_taken_and_refused() -> None:
    assert content_coding.body_coding([(b"content-encoding", b" GZIP ")]) == b"gzip"
    assert content_coding.body_coding([(b"content-encoding", b"identity")]) is None
    assert content_coding.body_coding([(b"content-type", b"application/json")]) is None
    twice = [(b"content-encoding", b"gzip"), (b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
    assert content_coding.body_coding(twice) == b"gzip, gzip"  # one list (RFC 9110 5.3): refused below
    assert "gzip, gzip is not one" in str(content_coding.refusal(b"gzip, gzip"))
    assert content_coding.refusal(b"deflate") is None
    assert "br is not one this server decodes (gzip, deflate or none)" in str(content_coding.refusal(b"br"))


@pytest.mark.parametrize(
    ("accept_encoding", "takes_gzip"),
    [
        ("gzip", True),
        ("gzip, deflate", True),  # httpx's and Prometheus' (Prometheus sends gzip alone)
        ("GZIP;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("br;q=1, *;q=0.1", True),
        ("", False),
        ("identity", False),
        ("deflate, br", False),
        ("gzip;q=0", False),
        ("gzip;q=0, *", False),  # named and refused: `*` stands for the codings not named
        ("gzip;q=nonsense", False),
    ],
)
def test_accept_encoding_read_for_gzip(accept_encoding: str, takes_gzip: bool) -> None:
    assert content_coding.accepts_gzip(accept_encoding) is takes_gzip
