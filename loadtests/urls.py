"""Where a load test may go: loopback targets only, unless the caller says otherwise (`--allow-remote`)."""

from __future__ import annotations

import ipaddress
import urllib.request
from urllib.parse import urlsplit

# Straight to the target: proxies from the environment would take loopback traffic elsewhere.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 10.0) -> bytes:
    with DIRECT.open(url, timeout=timeout) as response:
        return response.read()


def is_loopback_url(url: str) -> bool:
    """True for http(s) URLs on 127.0.0.0/8, ::1 or `localhost`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    host = parts.hostname
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_target(url: str, allow_remote: bool) -> str:
    """The URL without a trailing slash; ValueError for a malformed URL or a remote one not allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url: expected http://HOST:PORT, not {url!r}")
    if not allow_remote and not is_loopback_url(url):
        raise ValueError(
            f"--url {url}: not a loopback address (127.0.0.1, ::1, localhost); load tests go elsewhere only with "
            "--allow-remote"
        )
    return url.rstrip("/")
