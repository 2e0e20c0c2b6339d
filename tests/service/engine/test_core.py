"""The engine's models on a real EngineCore (tiny real models, their sessions): a load call is answered once every
front-end connected serves the new version, fails where one turns it down, and does not wait for one that left."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from service.engine.core import EngineCore
from service.errors import LoadFailed
from service.metrics import Metrics
from service.settings import Settings
from tests.service.lifecycle import publish

PAUSE_S = 0.2  # long enough for a load call that is not waiting any more to have been answered


async def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def offered(core: EngineCore, name: str, before: str | None) -> str:
    """The version the engine offers once a load put a new one in place of `before`."""

    def moved() -> bool:
        model = core.models.get(name)
        return model is not None and model.current is not None and model.current.version != before

    await until(moved)
    current = core.models[name].current
    assert current is not None
    return current.version


def test_a_load_call_waits_for_every_front_end_and_fails_where_one_turns_it_down(
    tiny_repository: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    keys = tmp_path / "admin.keys"
    keys.write_text("admin-key-0123456789abcdef\n")
    keys.chmod(0o600)
    settings = Settings(
        repository=repository, model_control="explicit", admin_api_key_file=keys, device="cpu", threads=1
    )

    async def scenario() -> None:
        core = EngineCore(settings, Metrics())
        core.connect("front-end 1")
        core.connect("front-end 2")
        try:
            call = asyncio.create_task(core.control("load", "a"))
            first = await offered(core, "a", None)
            core.use("front-end 1", "a", [first])
            await asyncio.sleep(PAUSE_S)
            assert not call.done()  # front-end 2 has not moved to it yet
            core.use("front-end 2", "a", [first])
            assert (await asyncio.wait_for(call, 5))["version"] == first

            publish(repository, "a", tiny_repository / "bert-classification")
            call = asyncio.create_task(core.control("load", "a"))
            second = await offered(core, "a", first)
            core.use("front-end 1", "a", [second])
            await asyncio.sleep(PAUSE_S)
            assert not call.done()
            core.forget("front-end 2")  # it left: nothing to wait for
            assert (await asyncio.wait_for(call, 5))["version"] == second

            core.connect("front-end 2")  # a new front-end, serving the version offered
            core.use("front-end 2", "a", [second])
            publish(repository, "a", tiny_repository / "bert-classification")
            call = asyncio.create_task(core.control("load", "a"))
            third = await offered(core, "a", second)
            core.use("front-end 1", "a", [third])
            core.reject("a", third, "self-test failed: the tokenizer gives other ids")  # front-end 2's
            with pytest.raises(LoadFailed, match="self-test failed"):
                await asyncio.wait_for(call, 5)
            current = core.models["a"].current
            assert current is not None and current.version == second  # the version before serves again
        finally:
            await core.stop()

    asyncio.run(scenario())
