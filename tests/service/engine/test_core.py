"""The engine's models on a real EngineCore (tiny real models, their sessions): a load call is answered once every
front-end connected serves the new version, fails where one turns it down, and does not wait for one that left."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from service.engine.core import WRITE_QUIET_S, EngineCore
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


def poll_core(repository: Path, metrics: Metrics) -> EngineCore:
    """A polling engine that loads an entry however lately its files were written (its tests publish, then poll
    at once; `test_polling_waits_for_files_copied_in_place_to_sit_still` keeps the wait)."""
    core = EngineCore(Settings(repository=repository, model_control="poll", device="cpu", threads=1), metrics)
    core.write_quiet_s = 0
    return core


def test_polling_tries_a_failed_version_again_once_its_files_are_written_again(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """A version that failed is not loaded again with the very files it failed with (a broken export fails the same
    way each time), but it is once they are written again: a load that failed because the entry changed under it
    (rolled back mid-load, then put back: the same digest) was skipped for good ("load it again", said the error)."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")

    async def scenario() -> None:
        core = poll_core(repository, Metrics())
        try:
            core.connect("front-end")
            await core.poll_once()
            first = await offered(core, "a", None)
            core.use("front-end", "a", [first])  # serving it: it stays open beside the next
            publish(repository, "a", tiny_repository / "bert-classification")
            await core.poll_once()
            second = await offered(core, "a", first)
            core.reject("a", second, "the entry changed since the engine loaded it: load it again")  # a front-end's
            assert core.models["a"].current.version == first  # type: ignore[union-attr]
            await core.poll_once()
            assert core.models["a"].current.version == first  # type: ignore[union-attr]  # the same files: not again
            rewritten = repository / ".a.rewritten"
            shutil.copytree(repository / "a", rewritten)  # the same bytes, new files: the same version
            shutil.rmtree(repository / "a")
            rewritten.rename(repository / "a")
            await core.poll_once()
            assert await offered(core, "a", first) == second
        finally:
            await core.stop()

    asyncio.run(scenario())


def test_a_failed_load_is_over_once_the_entry_is_the_version_serving_again(tiny_repository: Path, tmp_path: Path):
    """The failure gauge (BertserveModelLoadFailed) and the model's load_error stayed for good when the export that
    serves was put back (polling, or a load call answered 200), and `loading` said the failed version for good."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    serving = tmp_path / "serving-a"
    shutil.copytree(repository / "a", serving)
    metrics = Metrics()

    def failed_gauge() -> float:
        return metrics.model_load_failed.labels("a")._value.get()

    async def scenario() -> None:
        core = poll_core(repository, metrics)
        try:
            await core.poll_once()
            first = await offered(core, "a", None)
            for restore in ("poll", "load call"):
                publish(repository, "a", tiny_repository / "bert-classification", corrupt=True)
                await core.poll_once()
                state = core.models["a"].state()
                assert state["version"] == first and "failed to load" in state["load_error"]
                assert state["loading"] is None and failed_gauge() == 1
                shutil.rmtree(repository / "a")
                shutil.copytree(serving, repository / "a")  # the export that serves, back
                if restore == "poll":
                    await core.poll_once()
                else:
                    assert (await core.load_model("a"))["changed"] is False
                state = core.models["a"].state()
                assert (state["version"], state["load_error"], failed_gauge()) == (first, None, 0), restore
        finally:
            await core.stop()

    asyncio.run(scenario())


def test_polling_does_not_load_again_an_entry_that_failed_at_start_with_the_same_files(
    tiny_repository: Path, tmp_path: Path
) -> None:
    """An entry broken at start was loaded again by the first poll with the very files it had failed with: a second
    error logged and counted (bertserve_model_loads_total{result="failed"} 2) for one broken export; written again,
    it is."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification", corrupt=True)
    metrics = Metrics()

    def failures() -> float:
        return metrics.model_loads.labels("a", "failed")._value.get()

    async def scenario() -> None:
        core = poll_core(repository, metrics)
        try:
            core.load()
            assert core.models["a"].status == "failed" and failures() == 1
            await core.poll_once()
            assert failures() == 1  # the same files: not again
            publish(repository, "a", tiny_repository / "bert-classification")  # mended
            await core.poll_once()
            await offered(core, "a", None)
            assert core.models["a"].status == "ready" and failures() == 1
        finally:
            await core.stop()

    asyncio.run(scenario())


def test_polling_waits_for_files_copied_in_place_to_sit_still(tiny_repository: Path, tmp_path: Path) -> None:
    """Files copied over a served entry (`cp -r new/* models/a/`) were loaded by a scan that came between one file
    and the next: half old, half new, or a failed load logged, counted and alerted on. A changed entry loads once
    its files have sat still for WRITE_QUIET_S."""
    repository = tmp_path / "repository"
    repository.mkdir()
    publish(repository, "a", tiny_repository / "bert-classification")
    newer = tmp_path / "newer"
    publish(tmp_path, "newer", tiny_repository / "bert-classification")

    async def scenario() -> None:
        core = EngineCore(Settings(repository=repository, model_control="poll", device="cpu", threads=1), Metrics())
        assert core.write_quiet_s == WRITE_QUIET_S
        try:
            await asyncio.sleep(WRITE_QUIET_S)
            await core.poll_once()
            first = await offered(core, "a", None)
            for path in newer.iterdir():  # copied over it in place, file by file
                shutil.copy(path, repository / "a" / path.name)
            await core.poll_once()
            assert core.models["a"].current.version == first  # type: ignore[union-attr]
            assert core.models["a"].loading is None and core.models["a"].load_error is None
            await asyncio.sleep(WRITE_QUIET_S)
            await core.poll_once()
            assert await offered(core, "a", first) != first
        finally:
            await core.stop()

    asyncio.run(scenario())
