"""/docs and /redoc from the server's own files (no third-party host), the docs setting, and CORS: off unless an
allow-list is set, then Starlette's CORS with the one error body."""

from __future__ import annotations

import asyncio
import gzip
import re
from html.parser import HTMLParser

import httpx
import pytest
from pydantic import ValidationError

from service.frontend.http.app import create_app
from service.settings import Settings

KEY = "cors-key-0123456789abcdef"
ORIGIN = "https://app.example.com"
EXTERNAL = re.compile(r"(?:[a-z][a-z0-9+.-]*:)?//[a-z0-9.-]+", re.IGNORECASE)


class References(HTMLParser):
    """Every src and href of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


def references(html: str) -> list[str]:
    parser = References()
    parser.feed(html)
    return parser.urls


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_nothing_from_another_host(tiny_server, page: str) -> None:
    with tiny_server.client() as client:
        response = client.get(page)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
        html = response.text
        assert EXTERNAL.findall(html) == [], "the page names another host"
        urls = references(html)
        assert len(urls) >= 2 and all(url.startswith("/docs/assets/") for url in urls), urls
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 1000, url
            if url.endswith(".js"):
                assert "javascript" in asset.headers["content-type"]
        assert "'/openapi.json'" in html or '"/openapi.json"' in html
        assert client.get("/openapi.json").json()["info"]["title"] == "bertserve"
    if page == "/docs":
        assert '"validatorUrl": null' in html  # Swagger UI would send the schema to validator.swagger.io


def call(
    app, method: str, path: str, headers: dict[str, str] | None = None, content: bytes | None = None
) -> httpx.Response:
    """One request to the app in this process (its routes need no model)."""

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bertserve") as client:
            return await client.request(method, path, headers=headers, content=content)

    return asyncio.run(run())


def test_docs_off_serves_no_page_and_no_schema() -> None:
    app = create_app(Settings(docs="off"))
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/assets/swagger-ui-bundle.js", "/docs/oauth2-redirect"):
        response = call(app, "GET", path)
        assert response.status_code == 404, path
        assert response.json()["error_type"] == "not_found"
    assert call(app, "GET", "/livez").status_code == 200


def test_cors_is_off_without_an_allow_list() -> None:
    app = create_app(Settings())
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    response = call(app, "OPTIONS", "/v1/models/x/classify", preflight)
    assert response.status_code == 405 and response.json()["error_type"] == "method_not_allowed"
    assert not any(name.startswith("access-control-") for name in response.headers)
    response = call(app, "GET", "/livez", {"Origin": ORIGIN})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


def test_cors_with_an_allow_list_and_keys() -> None:
    app = create_app(Settings(cors_allow_origins=[ORIGIN], api_keys=[KEY]))
    # the preflight carries no key (browsers never send one): it is answered before the key is asked for
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-request-id",
    }
    response = call(app, "OPTIONS", "/v1/models/x/classify", preflight)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert {"authorization", "content-type", "x-request-id"} <= set(
        response.headers["access-control-allow-headers"].lower().replace(" ", "").split(",")
    )
    # a 401 says so to the page too (it can read the error), and the answer with a key exposes the request id
    response = call(app, "GET", "/v1/models", {"Origin": ORIGIN})
    assert response.status_code == 401 and response.headers["access-control-allow-origin"] == ORIGIN
    response = call(app, "GET", "/v1/models", {"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in response.headers["access-control-expose-headers"].lower()
    # another origin: no CORS headers on answers, and a refused preflight with the error body
    response = call(app, "GET", "/livez", {"Origin": "https://evil.example.net"})
    assert "access-control-allow-origin" not in response.headers
    response = call(app, "OPTIONS", "/v1/models", {**preflight, "Origin": "https://evil.example.net"})
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": "CORS preflight refused: Disallowed CORS origin",
        "error_type": "bad_request",
        "field": None,
    }
    assert len(response.headers["x-request-id"]) == 32


@pytest.mark.parametrize("origin", ["https://app.example.com/", "app.example.com", "https://a.example.com/path", ""])
def test_origins_that_could_never_match_are_refused(origin: str) -> None:
    with pytest.raises(ValidationError, match="is not an origin"):
        Settings(cors_allow_origins=[ORIGIN, origin])
    assert Settings(cors_allow_origins="*").cors_allow_origins == ["*"]
    assert Settings(cors_allow_origins=f"{ORIGIN}, http://localhost:3000").cors_allow_origins == [
        ORIGIN,
        "http://localhost:3000",
    ]


def test_a_cors_request_decodes_a_compressed_body_as_the_gateway_does() -> None:
    """A request with an Origin goes down the middleware stack (for the CORS headers): its gzip body is decoded
    there too, within the body limit, and bad data are the same 400."""
    app = create_app(Settings(cors_allow_origins=[ORIGIN], max_body_bytes=2_048))
    headers = {"Origin": ORIGIN, "content-type": "application/json", "content-encoding": "gzip"}
    path = "/v1/models/absent/classify"
    response = call(app, "POST", path, headers, gzip.compress(b'{"inputs": ["x"]}'))
    assert response.status_code == 404 and response.json()["error_type"] == "not_found", response.text
    assert response.headers["access-control-allow-origin"] == ORIGIN
    response = call(app, "POST", path, headers, gzip.compress(b'{"inputs": ["' + b"a" * 5_000 + b'"]}'))
    assert response.status_code == 413 and response.json()["error_type"] == "payload_too_large"
    response = call(app, "POST", path, headers, b'{"inputs": ["x"]}')
    assert response.status_code == 400 and "not valid gzip data" in response.json()["error"]
    assert response.headers["access-control-allow-origin"] == ORIGIN
