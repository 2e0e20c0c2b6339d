"""API keys: `Authorization: Bearer KEY` checked in pure ASGI middleware, before anything else reads the request.

Keys come from `--api-keys` (the environment: BERTSERVE_API_KEYS) and/or `--api-key-file` (one a line, `#`
comments). Only their SHA-256 digests are kept; a presented token is hashed once and compared with every digest
by `hmac.compare_digest`, all of them every time: neither the time taken nor an early exit tells which key (or
how much of one) matched. The file is re-read when it changes (device, inode, size, mtime or ctime), checked with
one stat at most once a second on the request path: rotation is writing the new file (or Kubernetes updating a
mounted Secret); both keys work while clients move over. A file that cannot be read or holds no valid key at that
point leaves the keys as they were, with a warning; at start it stops the server with the reason.

Always open: /livez and /readyz (an orchestrator's probes carry no key). /metrics and the docs (/docs, /redoc,
/openapi.json and their assets) by setting: protected by default once keys are set. Keys are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from service.errors import StartupError, Unauthorized
from service.frontend.http.errors import send_error
from service.settings import Settings, api_key_problem

log = logging.getLogger("service.frontend.http.auth")
RECHECK_S = 1.0
MAX_FILE_BYTES = 1_048_576
PROBES = frozenset({"/livez", "/readyz"})
DOCS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
DOCS_PREFIX = "/docs/"

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]
Signature = tuple[int, int, int, int, int]


class KeyFileProblem(StartupError):
    pass


def digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


def read_key_file(path: Path, setting: str = "api_key_file") -> tuple[list[bytes], Signature]:
    """The digests of the file's keys and the file's signature; KeyFileProblem says why it cannot be used (naming
    `setting`, the file's setting)."""
    where = f"{setting} {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # NONBLOCK: a FIFO must not hang the server
    except FileNotFoundError:
        raise KeyFileProblem(f"{where} does not exist") from None
    except OSError as exc:
        raise KeyFileProblem(f"{where} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileProblem(f"{where} is not a regular file")
        if info.st_mode & 0o007:
            raise KeyFileProblem(
                f"{where} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}): chmod 600 (or 640) it"
            )
        try:
            data = _read_whole(fd)
            text = data.decode("utf-8").removeprefix("\ufeff")  # a byte order mark (Notepad's) is no key's
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileProblem(f"{where} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
        if len(data) > MAX_FILE_BYTES:  # refused whole: a read cut short had taken a key's first characters for it
            raise KeyFileProblem(f"{where} is over {MAX_FILE_BYTES:,} bytes: too large for a key file")
    finally:
        os.close(fd)
    digests = []
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.split("#", 1)[0].strip()  # a key never holds '#' (api_key_problem)
        if not key:
            continue
        problem = api_key_problem(key)
        if problem:
            raise KeyFileProblem(f"{where} line {number}: the key {problem}")
        digests.append(digest(key))
    if not digests:
        raise KeyFileProblem(f"{where} holds no key")
    return digests, _signature(info)


def _read_whole(fd: int) -> bytes:
    """The file's bytes, up to one past MAX_FILE_BYTES (a read may return fewer bytes than asked)."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_FILE_BYTES and (chunk := os.read(fd, MAX_FILE_BYTES + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _signature(info: os.stat_result) -> Signature:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class ApiKeys:
    """The keys in force: those of the settings, and those of the key file as last read successfully."""

    def __init__(
        self,
        keys: Iterable[str] = (),
        file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        setting: str = "api_key_file",
    ) -> None:
        self._fixed = [digest(key) for key in keys]
        self._file = file
        self._setting = setting  # the file's setting, as its messages name it
        self._from_file: list[bytes] = []
        self._signature: Signature | None = None
        self._clock = clock
        self._next_check = 0.0
        if file is not None:
            self._from_file, self._signature = read_key_file(file, setting)
            self._next_check = clock() + RECHECK_S

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        """StartupError (with the reason) where the key file cannot be used."""
        return cls(settings.api_keys or (), settings.api_key_file)

    @property
    def enabled(self) -> bool:
        return bool(self._fixed) or self._file is not None

    @property
    def count(self) -> int:
        return len(set(self._current()))  # one key given twice (a variable and the file) is one key

    def shares_a_key_with(self, other: ApiKeys) -> bool:
        """Whether a key is in force in both."""
        return not set(self._current()).isdisjoint(other._current())

    def verify(self, token: bytes) -> bool:
        """Whether `token` is one of the keys; every key is compared, in constant time, whatever the answer."""
        presented = digest(token)
        match = False
        for known in self._current():
            match |= hmac.compare_digest(presented, known)
        return match

    def _current(self) -> list[bytes]:
        if self._file is not None:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + RECHECK_S
                self._reload_if_changed()
        return self._fixed + self._from_file if self._fixed else self._from_file

    def _reload_if_changed(self) -> None:
        assert self._file is not None
        try:
            signature: Signature | None = _signature(os.stat(self._file))
        except OSError:
            signature = None
        if signature == self._signature:
            return
        self._signature = signature  # whatever happens now, one warning per change, not one a second
        try:
            self._from_file, self._signature = read_key_file(self._file, self._setting)
        except KeyFileProblem as exc:
            log.warning("%s; keeping the %d keys read before", exc, len(self._from_file))
            return
        log.info("%s %s re-read: %d keys", self._setting, self._file, len(self._from_file))


def bearer_token(scope: Scope) -> bytes | None:
    """The request's bearer token; None where it sends none; b"" (no key's) where it sends two Authorization
    headers: which one counts would be a proxy's guess (gRPC's metadata was read last-wins, HTTP first-wins)."""
    found = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if found is not None:
                return b""
            found = value
    if found is None:
        return None
    scheme, _, token = found.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


def unauthorized(token: bytes | None) -> Unauthorized:
    """The 401 for a request without a key (`token` None) or with one that is not valid."""
    if token is None:
        challenge = 'Bearer realm="bertserve"'
        message = "this server needs an API key: send the header Authorization: Bearer KEY"
    else:
        challenge = 'Bearer realm="bertserve", error="invalid_token"'
        message = "the API key is not valid"
    return Unauthorized(message, headers={"WWW-Authenticate": challenge})


class AuthMiddleware:
    """401 with the error body (and `WWW-Authenticate: Bearer`) for any request without a valid key, except on
    the open paths."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, open_paths: frozenset[str], open_prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.keys = keys
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or self._open(scope["path"]):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        if token is not None and self.keys.verify(token):
            await self.app(scope, receive, send)
            return
        await send_error(send, unauthorized(token))

    def _open(self, path: str) -> bool:
        return path in self.open_paths or path.startswith(self.open_prefixes)


def open_paths(settings: Settings) -> tuple[frozenset[str], tuple[str, ...]]:
    """The paths (and path prefixes) that need no key under these settings."""
    paths = set(PROBES)
    prefixes: tuple[str, ...] = ()
    if settings.metrics_auth == "open":
        paths.add("/metrics")
    if settings.docs_auth == "open":
        paths |= DOCS
        prefixes = (DOCS_PREFIX,)
    if settings.model_control == "explicit":  # the admin key is checked by the routes (repository_api)
        prefixes = (*prefixes, "/v2/repository/")
    return frozenset(paths), prefixes
