"""Request bodies in a content coding (RFC 9110 8.4): gzip and deflate, as Triton's HTTP endpoint takes them and
tritonclient sends them (`infer(..., request_compression_algorithm="gzip" | "deflate")`); any other coding is a
415 that names the ones taken. Answers are not coded, but for /metrics, gzip where the client accepts it
(`accepts_gzip`): Prometheus asks for it at every scrape.

The body limit holds twice: the bytes that arrive (the body as sent, before decoding) and the bytes they decode
to, which stop at `max_bytes` + 1 (a 413, so a small body that inflates to gigabytes costs one limit's worth of
memory, not its own size). A body that is no such stream, or stops short of its end, or has bytes after it, is a
400 that says so.
"""

from __future__ import annotations

import zlib

from service.errors import BadRequest, PayloadTooLarge

# Content-Encoding's value -> zlib's window bits for it: gzip's header and trailer, or zlib's ("deflate" is the
# zlib format, RFC 9110 8.4.1.2; tritonclient sends `zlib.compress`). x-gzip is gzip's old name (RFC 9110 8.4.1.3).
CODINGS = {b"gzip": 31, b"x-gzip": 31, b"deflate": 15}
IDENTITY = (b"identity", b"")
TAKEN = "gzip, deflate or none"


def body_coding(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The request body's coding, lower case (None where it has none, or `identity`); two Content-Encoding
    headers are one list (RFC 9110 5.3: "gzip" twice is "gzip, gzip", two codings, refused as the one header is)."""
    codings = [value.strip().lower() for name, value in headers if name == b"content-encoding"]
    if not codings:
        return None
    coding = codings[0] if len(codings) == 1 else b", ".join(codings)
    return None if coding in IDENTITY else coding


def refusal(coding: bytes) -> str | None:
    """Why a body in `coding` is refused (415), or None where it is one taken."""
    if coding in CODINGS:
        return None
    shown = coding.decode("latin-1")[:40]
    return f"the body's Content-Encoding {shown} is not one this server decodes ({TAKEN})"


def decoded(body: bytes, coding: bytes, max_bytes: int) -> bytes:
    """`body` decoded from `coding` (one of CODINGS); PayloadTooLarge where it decodes to more than `max_bytes`,
    BadRequest where it is no such stream. gzip's members one after another are one body (RFC 1952 2.2)."""
    wbits = CODINGS[coding]
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        stream = zlib.decompressobj(wbits)
        try:
            part = stream.decompress(rest, max_bytes + 1 - size)
        except zlib.error as exc:
            raise BadRequest(f"the body is not valid {coding.decode()} data ({exc})") from None
        size += len(part)
        if size > max_bytes:
            raise PayloadTooLarge(f"the request body decodes to more than {max_bytes} bytes")
        parts.append(part)
        if not stream.eof:
            raise BadRequest(f"the body's {coding.decode()} data stop before their end")
        rest = stream.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if wbits != CODINGS[b"gzip"]:
            raise BadRequest(f"the body has {len(rest)} bytes after its {coding.decode()} data")


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value (RFC 9110 12.5.3) takes gzip: named, or `*`, with a weight above 0 (a
    `gzip;q=0` refuses it whatever `*` says)."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, parameters = item.partition(";")
        weight = 1.0
        name, _, value = parameters.strip().partition("=")
        if name.strip().lower() == "q":
            try:
                weight = float(value)
            except ValueError:
                weight = 0.0
        weights[coding.strip().lower()] = weight
    for coding in ("gzip", "x-gzip", "*"):
        if coding in weights:
            return weights[coding] > 0
    return False
