"""A stand-in for the Hugging Face hub on 127.0.0.1: serves folders as model repositories, one commit each.

It answers what huggingface_hub's `HfApi.model_info` and `snapshot_download` ask (read from huggingface_hub 2.4's
hf_api.py, _snapshot_download.py and file_download.py): the model info at a revision
(`GET /api/models/{repo}[/revision/{rev}]`: id, sha, siblings), the recursive tree at a commit
(`GET /api/models/{repo}/tree/{commit}`: type, path, size, oid and lfs per file), and each file
(`HEAD` and `GET /{repo}/resolve/{commit}/{path}`, with the `X-Repo-Commit` and `ETag` headers the client requires).
Unknown repositories, revisions and files get the hub's 404 and its `X-Error-Code`. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".onnx", ".model")


class Repository:
    def __init__(self, repo_id: str, directory: Path) -> None:
        self.repo_id = repo_id
        self.files = {
            path.relative_to(directory).as_posix(): path.read_bytes()
            for path in sorted(directory.rglob("*"))
            if path.is_file()
        }
        oids = "".join(f"{name}:{git_blob_id(data)}\n" for name, data in self.files.items())
        self.commit = hashlib.sha1(f"{repo_id}\n{oids}".encode()).hexdigest()

    def info(self) -> dict[str, Any]:
        return {
            "id": self.repo_id,
            "modelId": self.repo_id,
            "sha": self.commit,
            "private": False,
            "siblings": [{"rfilename": name} for name in self.files],
        }

    def tree(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        folders = sorted({name.rsplit("/", 1)[0] for name in self.files if "/" in name})
        for folder in folders:
            entries.append({"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest()})
        for name, data in self.files.items():
            entry: dict[str, Any] = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandInHub:
    """`with StandInHub({"owner/name": folder}) as hub:` serves at hub.url; hub.requests lists (method, path)."""

    def __init__(self, repositories: dict[str, Path]) -> None:
        self.repositories = {repo_id: Repository(repo_id, path) for repo_id, path in repositories.items()}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def downloads(self, repo_id: str) -> set[str]:
        """The files of repo_id fetched with GET."""
        prefix = f"/{repo_id}/resolve/"
        return {
            path[len(prefix) :].split("/", 1)[1]
            for method, path in self.requests
            if method == "GET" and path.startswith(prefix)
        }

    def _find(self, rest: str) -> tuple[Repository | None, str]:
        for repo_id, repository in self.repositories.items():
            if rest == repo_id or rest.startswith(repo_id + "/"):
                return repository, rest[len(repo_id) + 1 :]
        return None, ""

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def _answer(self, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                with hub._lock:
                    hub.requests.append((self.command, path))
                if path.startswith("/api/models/"):
                    repository, tail = hub._find(path[len("/api/models/") :])
                    if repository is None:
                        return self._error(404, "RepoNotFound", "Repository not found", body)
                    kind, _, rest = tail.partition("/")
                    revision = rest.split("/", 1)[0]
                    if kind in ("", "revision", "tree") and revision not in ("", "main", repository.commit):
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
                    if kind in ("", "revision"):
                        return self._send(200, json.dumps(repository.info()).encode(), body, repository)
                    if kind == "tree":
                        return self._send(200, json.dumps(repository.tree()).encode(), body, repository)
                    return self._error(404, None, "Not found", body)
                repository, tail = hub._find(path.lstrip("/"))
                if repository is None:
                    return self._error(404, "RepoNotFound", "Repository not found", body)
                kind, _, rest = tail.partition("/")
                revision, _, name = rest.partition("/")
                if kind != "resolve":
                    return self._error(404, None, "Not found", body)
                if revision not in ("main", repository.commit):
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
                if name not in repository.files:
                    return self._error(404, "EntryNotFound", f"{name} does not exist", body, repository)
                data = repository.files[name]
                etag = hashlib.sha256(data).hexdigest()
                headers = {"ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
                self._send(200, data, body, repository, headers, "application/octet-stream")

            def _send(
                self,
                status: int,
                data: bytes,
                body: bool,
                repository: Repository | None = None,
                headers: dict[str, str] | None = None,
                content_type: str = "application/json",
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                if repository is not None:
                    self.send_header("X-Repo-Commit", repository.commit)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _error(
                self, status: int, code: str | None, message: str, body: bool, repository: Repository | None = None
            ) -> None:
                headers = {"X-Error-Code": code, "X-Error-Message": message} if code else {}
                self._send(status, json.dumps({"error": message}).encode(), body, repository, headers)

        return Handler
