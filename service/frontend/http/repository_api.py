"""The Open Inference Protocol's model repository extension, under --model-control explicit only:

- `POST /v2/repository/index`: every entry of the repository and every loaded model, with its state (READY,
  LOADING, UNLOADING, UNAVAILABLE), version and the reason it is not ready; `{"ready": true}` lists the ready ones.
- `POST /v2/repository/models/{name}/load`: load the entry's version on disk beside the one serving; answered once
  every front-end serves it (warmed up, and self-tested by each), or with the reason it failed (422 load_failed: the
  version before keeps serving). The version already serving: answered at once.
- `POST /v2/repository/models/{name}/unload`: new requests get 404 at once; the ones in flight finish; answered
  once the model's sessions are closed (or with state UNLOADING where requests still hold it at the deadline).

The engine loads and unloads (one load at a time); this front-end asks it and waits for its word. The routes need
an admin key (--admin-api-key-file, re-read when it changes): 401 without one, 403 with an inference key.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request

from service.errors import BadRequest, Forbidden, LoadFailed, StartupError, Unauthorized
from service.frontend.http.auth import ApiKeys, bearer_token
from service.frontend.http.routes import ERRORS, json_body, server_state
from service.frontend.http.state import ServerState
from service.repository import name_problem
from service.settings import Settings
from service.wire.model_status import ModelStatus

ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {**ERRORS, 401: ERRORS[400], 403: ERRORS[400]}
PREFIX = "/v2/repository/"
SETTLE_S = 60.0  # the longest a load call waits for the front-end's self-test, after the engine's warm-up


class AdminKeys:
    """The admin keys (their own file), told apart from the inference keys."""

    def __init__(self, settings: Settings) -> None:
        self.admin = admin_keys(settings)
        self.inference = ApiKeys.from_settings(settings)
        if self.inference.enabled and self.admin.shares_a_key_with(self.inference):
            # the admin key would be checked first: every client holding that inference key could load and unload
            raise StartupError(
                "a key of admin_api_key_file is also an inference key (api_keys or api_key_file): the admin keys "
                "must be separate, else every client holding it can load and unload models"
            )

    def check(self, request: Request) -> None:
        token = bearer_token(dict(request.scope))
        if token is None:
            raise Unauthorized(
                "the repository API needs an admin key: send the header Authorization: Bearer ADMIN_KEY",
                headers={"WWW-Authenticate": 'Bearer realm="bertserve-admin"'},
            )
        if self.admin.verify(token):
            return
        if self.inference.enabled and self.inference.verify(token):
            raise Forbidden("an inference key cannot load or unload models: use an admin key (--admin-api-key-file)")
        raise Unauthorized(
            "the admin key is not valid",
            headers={"WWW-Authenticate": 'Bearer realm="bertserve-admin", error="invalid_token"'},
        )


def admin_keys(settings: Settings) -> ApiKeys:
    """The admin key file's keys; StartupError (KeyFileProblem) says why the file cannot be used."""
    assert settings.admin_api_key_file is not None  # Settings refuses explicit mode without it
    return ApiKeys(file=settings.admin_api_key_file, setting="admin_api_key_file")


def install_repository_api(app: FastAPI, settings: Settings) -> None:
    """Mount the routes where --model-control is explicit; nothing otherwise (they are 404 then)."""
    if settings.model_control != "explicit":
        return
    keys = AdminKeys(settings)
    router = APIRouter(tags=["repository"], responses=ADMIN_ERRORS)

    @router.post("/v2/repository/index", summary="Every entry of the repository, with its state and version")
    async def index(request: Request) -> list[dict[str, Any]]:
        keys.check(request)
        ready_only = False
        if await request.body():
            body = await json_body(request)
            ready_only = isinstance(body, dict) and body.get("ready") is True
        result = await server_state(request).engine.control("index", "")
        models = list(result.get("models", []))
        return [m for m in models if m["state"] == "READY"] if ready_only else models

    @router.post("/v2/repository/models/{name:path}/load", summary="Load a model, or a new version of it")
    async def load(name: str, request: Request) -> dict[str, Any]:
        keys.check(request)
        _check_name(name)
        await _check_load_parameters(request)
        server = server_state(request)
        since = time.monotonic_ns()  # a load the engine makes for this call is an offer made after this
        result = await server.engine.control("load", name)
        return await _served(server, name, str(result["version"]), since)

    @router.post("/v2/repository/models/{name:path}/unload", summary="Unload a model")
    async def unload(name: str, request: Request) -> dict[str, Any]:
        keys.check(request)
        _check_name(name)
        server = server_state(request)
        await server.engine.control("unload", name)
        give_up = time.monotonic() + server.settings.request_timeout_s + 1
        while _unloading(server, name) and time.monotonic() < give_up:
            await _next_word(server)
        model = server.registry.models.get(name)
        if model is None:
            return {"name": name, "state": "UNAVAILABLE"}
        # still draining; or loaded again meanwhile (a load call after this one): it waited for the drain's whole
        # timeout and said UNLOADING of a model that served
        if _unloading(server, name):
            return {"name": name, "state": "UNLOADING"}
        return {"name": name, "state": "READY" if model.status == ModelStatus.READY else "LOADING"}

    app.include_router(router)


def _unloading(server: ServerState, name: str) -> bool:
    model = server.registry.models.get(name)
    return model is not None and model.engine_report.get("status") == ModelStatus.UNLOADING


async def _check_load_parameters(request: Request) -> None:
    """A load takes the entry as exported: Triton's configuration override (tritonclient's `load_model(config=...)`)
    and model files sent with the call (`files=`) are refused (400), never ignored: the call was answered 200 as if
    they had been applied."""
    if not await request.body():
        return
    body = await json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("the load request's body must be a JSON object", field="body")
    parameters = body.get("parameters")
    if parameters is None:
        return
    if not isinstance(parameters, dict):
        raise BadRequest("parameters must be an object", field="parameters")
    for key in parameters:
        shown = key[:60]
        if key == "config" or key.startswith("file:"):
            raise BadRequest(
                f"parameter {shown!r} is not taken: this server loads the repository's entry as exported, with no "
                "configuration override or files sent with the call (export the checkpoint into the repository "
                "with python -m export, then load it by name)",
                field=f"parameters.{shown}",
            )
        raise BadRequest(f"parameter {shown!r} is not one a load takes", field=f"parameters.{shown}")


def _check_name(name: str) -> None:
    if problem := name_problem(name):
        raise BadRequest(problem, field="name")


async def _served(server: ServerState, name: str, version: str, since: int) -> dict[str, Any]:
    """Once this front-end serves `version` (its self-test passed), or turned down a load of it made since `since`
    (LoadFailed; a load of the same version turned down before this call is not this call's answer)."""
    registry = server.registry
    give_up = time.monotonic() + SETTLE_S
    seen = False
    while time.monotonic() < give_up:
        model = registry.models.get(name)
        if model is not None and model.version == version and model.status == ModelStatus.READY:
            return {"name": name, "version": version, "state": "READY"}
        for (rejected_name, rejected_version, offer), why in registry.rejected.items():
            if (rejected_name, rejected_version) == (name, version) and offer is not None and offer >= since:
                raise LoadFailed(f"model {name} version {version} failed to load: {why}")
        seen = seen or model is not None  # the engine's word on a load may come after its answer to the call
        if (seen and model is None) or _unloading(server, name):  # an unload call came after the engine's answer
            raise LoadFailed.unloaded(name, version)
        await _next_word(server)
    return {"name": name, "version": version, "state": "LOADING"}


async def _next_word(server: ServerState) -> None:
    """A moment, for the engine's next word or this front-end's swap."""
    await asyncio.sleep(0.02)
