"""/docs (Swagger UI) and /redoc from files served here, not from a CDN; and the schema's Bearer scheme.

FastAPI's own pages load their scripts and styles from cdn.jsdelivr.net (and ReDoc its fonts from Google): a
browser opening /docs would fetch code from a third party, and the page is blank where that host cannot be
reached. The assets here come from the `fastapi-offline` package (Swagger UI 5 and ReDoc 2 bundles, pinned by the
lock), served under /docs/assets. `--docs off` serves none of /docs, /redoc, /openapi.json.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from service.frontend.http import schemas

ASSETS_URL = "/docs/assets"
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")
SWAGGER_PARAMETERS = {"validatorUrl": None, "persistAuthorization": True}  # no call to validator.swagger.io


def assets_directory() -> Path:
    return Path(str(importlib.resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI, title: str) -> None:
    """The pages and their assets; `app` was made with docs_url=None and redoc_url=None."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_directory()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            oauth2_redirect_url=redirect_url,
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=SWAGGER_PARAMETERS,
        )

    @app.get(redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )


def document_bearer_auth(app: FastAPI, open_paths: frozenset[str]) -> None:
    """With API keys set: the schema says so (a Bearer scheme, 401 on every operation that needs a key), and
    Swagger UI's Authorize button sends the key."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schema.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "an API key of the server (--api-keys, --api-key-file)",
        }
        unauthorized = {"description": "No API key, or not a valid one", "content": _error_content()}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                if path in open_paths:
                    operation["security"] = []
                else:
                    operation["security"] = [{"apiKey": []}]
                    operation.setdefault("responses", {})["401"] = unauthorized
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _error_content() -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{schemas.ErrorBody.__name__}"}
    return {"application/json": {"schema": ref}}
