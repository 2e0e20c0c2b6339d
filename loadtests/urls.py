"""Where a load test may go (loopback targets only, unless the caller says otherwise: `--allow-remote`), and the
preflight request that asks the server for its models (with the API key, if any)."""

from __future__ import annotations

import ipaddress
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

# Straight to the target: proxies from the environment would take loopback traffic elsewhere.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


API_KEY_ENV = "BERTSERVE_LOADTEST_API_KEY"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer KEY` for a server started with API keys; nothing without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def http_get(url: str, timeout: float = 10.0, api_key: str | None = None) -> bytes:
    request = urllib.request.Request(url, headers=auth_headers(api_key))
    with DIRECT.open(request, timeout=timeout) as response:
        return response.read()


def models_of(body: bytes, url: str) -> list[dict[str, Any]]:
    """The `models` list of a bertserve `/v1/models` answer; ValueError when the answer has another shape (an
    OpenAI-style `{"object": "list", "data": [...]}`, a bare list, not JSON): the URL is not a bertserve server."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, list) or not all(
        isinstance(model, dict) and isinstance(model.get("name"), str) for model in models
    ):
        raise ValueError(
            f"the server at {url} does not look like bertserve: its /v1/models answer is not "
            '{"models": [{"name": ..., "task": ..., "status": ...}, ...]}'
        )
    return models


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


def fetch_models(url: str, api_key: str | None = None) -> list[dict[str, Any]]:
    """The server's models from `/v1/models`. ValueError, saying what to do, for a refused key (401, 403) or a
    server that is not bertserve (another status, another shape); OSError (URLError) when it cannot be reached."""
    try:
        body = http_get(url + "/v1/models", api_key=api_key)
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            sent = "the key sent is not one it accepts" if api_key else "no key was sent"
            raise ValueError(
                f"the server refused the key (HTTP {error.code}): pass --api-key KEY or set {API_KEY_ENV} "
                f"({url}: {sent})"
            ) from None
        raise ValueError(
            f"the server at {url} does not look like bertserve: /v1/models answered HTTP {error.code}"
        ) from None
    return models_of(body, url)
