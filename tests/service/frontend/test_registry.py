"""The registry follows the engine's word, in this process (a real EngineCore, sessions and tokenizers): a model
loading for the first time is listed as loading at the engine's first word on it, and /readyz stays 200 meanwhile;
a reload moves traffic to the new version in one step, and the old version closes once no request holds it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from service.frontend.http.state import ServerState
from service.settings import Settings
from service.wire.model_status import ModelStatus
from service.wire.ticket import Ticket
from tests.service.lifecycle import publish


async def until(condition, timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_first_load_listed_as_loading_and_a_reload_in_one_step(tiny_repository: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    publish(repository, "b", tiny_repository / "bert-ner")
    keys = tmp_path / "admin.keys"
    keys.write_text("admin-key-0123456789abcdef\n")
    keys.chmod(0o600)
    settings = Settings(
        repository=repository,
        model_control="explicit",
        model=["a"],
        admin_api_key_file=keys,
        device="cpu",
        threads=1,
        release_memory_idle_s=0,
    )

    async def scenario() -> None:
        server = ServerState(settings)
        server.load()
        seen: list[tuple[str, int]] = []

        def on_change() -> None:
            server.registry.sync()
            if "b" in server.registry.models:
                seen.append((server.registry.models["b"].status, server.readiness()[0]))

        await server.engine.start(on_change)
        follow = asyncio.create_task(server.self_test_models())
        try:
            await until(lambda: server.registry.ready)
            loaded = await server.engine.control("load", "b")
            await until(lambda: server.registry.models["b"].status == ModelStatus.READY)
            assert seen[0] == (ModelStatus.LOADING, 200), seen
            assert server.registry.models["b"].version == loaded["version"]

            old = server.registry.models["a"]
            held = Ticket.with_timeout(30)
            assert await server.registry.serving("a", 1.0, held) is old  # a request in flight holds version 1
            publish(repository, "a", tiny_repository / "bert-classification")
            reloaded = await server.engine.control("load", "a")
            await until(lambda: server.registry.models["a"].version == reloaded["version"])
            new = server.registry.models["a"]
            assert new is not old and new.self_tested and server.readiness()[0] == 200
            core = server.engine.core  # type: ignore[attr-defined]
            assert core.models["a"].generation(old.version) is not None  # open while the request holds it
            outputs = await server.engine.infer(old.target, [], held)  # the old version still answers it
            assert outputs == []
            held.done()  # its request is over
            await until(lambda: core.models["a"].generation(old.version) is None)
            assert [g.version for g in (core.models["a"].current, *core.models["a"].older)] == [new.version]
        finally:
            follow.cancel()
            await server.engine.stop()

    asyncio.run(scenario())
