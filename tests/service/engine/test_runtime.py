"""The runtime on a real session: shape buckets pad without changing answers, and warm-up covers the grid."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import numpy as np
import pytest

from bertcore.model_config import ModelConfig
from bertcore.rows import Row
from service.engine.batcher import Batcher
from service.engine.core import EngineCore
from service.engine.runtime import ModelRuntime
from service.errors import NonFiniteOutput
from service.metrics import Metrics
from service.settings import Settings
from service.wire.ticket import Ticket
from tests.harness.broken_models import poisoned_copy

BUCKETS = {"shape_buckets": "on", "max_batch_size": 8, "max_batch_tokens": 512, "bucket_width_step": 16}


def runtime_for(entry: Path, **settings: object) -> ModelRuntime:
    return ModelRuntime(entry, ModelConfig.read(entry), Settings(**{"device": "cpu", "threads": 1, **settings}))


def random_rows(count: int, seed: int, max_length: int = 60) -> list[Row]:
    generator = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        n = int(generator.integers(3, max_length))
        ids = generator.integers(5, 90, n).astype(np.int64)
        rows.append(Row(ids, np.zeros(n, dtype=np.int64)))
    return rows


def test_the_cpu_keeps_exact_length_batches_unless_buckets_are_asked_for(tiny_repository: Path) -> None:
    exact = runtime_for(tiny_repository / "bert-classification")
    assert exact.grid is None and exact.graphs is None
    assert exact.prepare(random_rows(3, seed=1)).shape == (3, max(len(r) for r in random_rows(3, seed=1)))
    bucketed = runtime_for(tiny_repository / "bert-classification", **BUCKETS)
    assert bucketed.grid is not None and bucketed.graphs is None  # CUDA graphs only on CUDA
    rows = random_rows(3, seed=1)
    assert bucketed.prepare(rows).shape == bucketed.grid.bucket(3, max(len(r) for r in rows))


def test_prepare_puts_each_row_in_its_place_and_pads_the_rest(tiny_repository: Path) -> None:
    runtime = runtime_for(tiny_repository / "bert-classification", **BUCKETS)
    assert runtime.grid is not None
    rows = [Row(np.arange(10, 10 + n, dtype=np.int64), np.arange(n, dtype=np.int64) % 2) for n in (5, 1, 9)]
    feed = runtime.prepare(rows).feed
    ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
    assert ids.shape == mask.shape == types.shape == runtime.grid.bucket(3, 9) == (4, 16)
    pad = runtime.pad_token_id
    for i, row in enumerate(rows):
        n = len(row)
        assert ids[i, :n].tolist() == row.input_ids.tolist() and (ids[i, n:] == pad).all()
        assert types[i, :n].tolist() == row.token_type_ids.tolist() and not types[i, n:].any()
        assert mask[i, :n].all() and not mask[i, n:].any()
    # the filler row: all padding, attending to its first token only (no row may be all-masked)
    assert (ids[3] == pad).all() and not types[3].any() and mask[3].tolist() == [1] + [0] * 15


@pytest.mark.parametrize("cell", ["bert-classification", "roberta-ner", "distilbert-qa"])
def test_padding_to_a_bucket_does_not_change_any_rows_outputs(tiny_repository: Path, cell: str) -> None:
    exact = runtime_for(tiny_repository / cell)
    bucketed = runtime_for(tiny_repository / cell, **BUCKETS)
    for seed, count in enumerate((1, 3, 5, 8)):
        rows = random_rows(count, seed)
        want, got = exact.run(rows), bucketed.run(rows)
        assert len(got) == count
        for w, g in zip(want, got, strict=True):
            assert w.keys() == g.keys()
            for name in w:
                assert g[name].shape == w[name].shape
                np.testing.assert_allclose(g[name], w[name], atol=1e-4)


def test_a_left_padding_model_gets_its_rows_at_the_end_and_the_same_answers_in_any_batch(family_repository) -> None:
    """XLNet pads on the left (its classifier token is last): rows end at the batch's last column, filler rows
    attend to that column, and each row's outputs are its own, alone, in a batch or in a bucket."""
    repository, _ = family_repository
    bucketed = runtime_for(repository / "xlnet-classification", **BUCKETS)
    assert bucketed.left_padded
    rows = [Row(np.arange(10, 10 + n, dtype=np.int64), np.arange(n, dtype=np.int64) % 2) for n in (5, 1, 9)]
    feed = bucketed.prepare(rows).feed
    ids, mask, types = feed["input_ids"], feed["attention_mask"], feed["token_type_ids"]
    assert ids.shape == (4, 16)
    for i, row in enumerate(rows):
        n = len(row)
        assert ids[i, 16 - n :].tolist() == row.input_ids.tolist() and (ids[i, : 16 - n] == bucketed.pad_token_id).all()
        assert types[i, 16 - n :].tolist() == row.token_type_ids.tolist() and not types[i, : 16 - n].any()
        assert mask[i, 16 - n :].all() and not mask[i, : 16 - n].any()
    assert mask[3].tolist() == [0] * 15 + [1]
    for cell in ("xlnet-classification", "xlnet-ner"):
        exact, bucketed = runtime_for(repository / cell), runtime_for(repository / cell, **BUCKETS)
        rows = random_rows(5, seed=3)
        alone = [exact.run([row])[0] for row in rows]
        for outputs in (exact.run(rows), bucketed.run(rows)):
            for want, got in zip(alone, outputs, strict=True):
                for name in want:
                    assert got[name].shape == want[name].shape
                    np.testing.assert_allclose(got[name], want[name], atol=1e-5)


def test_warm_up_runs_every_bucket_on_the_batch_thread_and_batches_stay_in_the_grid(tiny_repository: Path) -> None:
    settings = Settings(device="cpu", threads=1, **BUCKETS)
    core = EngineCore(
        settings.model_copy(update={"models": ["bert-classification"], "repository": tiny_repository}), Metrics()
    )
    core.load()
    runtime = core.models["bert-classification"].runtime
    assert runtime is not None and runtime.grid is not None
    shapes: list[tuple[int, int]] = []
    threads: set[str] = set()
    execute = runtime._execute  # what warm-up and every batch run through, on the session they take

    def recording(batch, session):
        shapes.append(batch.shape)
        threads.add(threading.current_thread().name)
        return execute(batch, session)

    runtime._execute = recording  # type: ignore[method-assign]

    async def scenario() -> None:
        core.start()
        try:
            await core.warm_up()
            warmed = set(shapes)
            assert warmed == set(runtime.grid.shapes) and len(shapes) == len(runtime.grid.shapes)
            assert core.models["bert-classification"].state()["warmed_shapes"] == len(warmed)
            shapes.clear()
            rng = random.Random(7)
            requests = [random_rows(rng.randint(1, 6), seed) for seed in range(40)]
            await asyncio.gather(*(core.infer("bert-classification", r, Ticket.with_timeout(30)) for r in requests))
            assert shapes and set(shapes) <= warmed
        finally:
            await core.stop()

    asyncio.run(scenario())
    assert threads == {"infer-bert-classification_0"}


def test_streams_share_the_threads_and_one_session_and_answer_as_one_stream(tiny_repository: Path) -> None:
    entry = tiny_repository / "roberta-ner"
    reference = runtime_for(entry)
    settings = Settings(device="cpu", threads=2, cpu_streams=2, max_batch_size=4, max_padding_ratio=1.0)
    core = EngineCore(settings.model_copy(update={"models": ["roberta-ner"], "repository": tiny_repository}), Metrics())
    core.load()
    runtime = core.models["roberta-ner"].runtime
    assert runtime is not None and runtime.streams == 2
    assert runtime.session.get_session_options().intra_op_num_threads == 1  # 2 threads shared by 2 streams
    threads: set[str] = set()
    execute = runtime.execute

    def recording(batch):
        threads.add(threading.current_thread().name)
        return execute(batch)

    runtime.execute = recording  # type: ignore[method-assign]
    requests = [random_rows(random.Random(seed).randint(1, 6), seed) for seed in range(60)]

    async def scenario() -> list[list[dict]]:
        core.start()
        try:
            await core.warm_up()
            return await asyncio.gather(*(core.infer("roberta-ner", r, Ticket.with_timeout(30)) for r in requests))
        finally:
            await core.stop()

    answers = asyncio.run(scenario())
    assert threads == {"infer-roberta-ner_0", "infer-roberta-ner_1"}
    for request, answer in zip(requests, answers, strict=True):
        for want, got in zip(reference.run(request), answer, strict=True):
            np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-5)


def test_a_prepare_failure_fails_only_that_batch() -> None:
    def prepare(rows: list[str]) -> list[str]:
        if "bad" in rows:
            raise RuntimeError("cannot pad")
        return rows

    async def scenario() -> tuple[BaseException | list[str], ...]:
        batcher = Batcher(
            "t",
            lambda prepared: [f"out:{r}" for r in prepared],
            prepare=prepare,
            max_batch_size=1,
            max_batch_tokens=100,
            max_wait_s=0.0,
            max_queue_rows=10,
        )
        batcher.start()
        try:
            return tuple(
                await asyncio.gather(
                    batcher.submit(["bad"], Ticket.with_timeout(5)),
                    batcher.submit(["good"], Ticket.with_timeout(5)),
                    return_exceptions=True,
                )
            )
        finally:
            await batcher.stop()

    failed, answered = asyncio.run(scenario())
    assert type(failed).__name__ == "InferenceFailed" and answered == ["out:good"]


POISONED_ID = 42  # a token id of every tiny vocabulary


@pytest.mark.parametrize("cell", ["bert-classification", "bert-ner", "bert-qa"])
def test_a_row_the_model_answers_nan_for_is_refused_alone(tiny_repository: Path, tmp_path: Path, cell: str) -> None:
    clean = runtime_for(tiny_repository / cell, cpu_variant="fp32")
    poisoned = runtime_for(poisoned_copy(tiny_repository / cell, tmp_path / cell, POISONED_ID), cpu_variant="fp32")
    rows = random_rows(6, seed=3)
    assert not any((row.input_ids == POISONED_ID).any() for row in rows)
    ids = rows[2].input_ids.copy()
    ids[len(ids) // 2] = POISONED_ID
    rows[2] = Row(ids, rows[2].token_type_ids)
    want, got = clean.run(rows), poisoned.run(rows)
    assert all(np.isfinite(values).all() for row in want for values in row.values())  # the clean model's: all finite
    assert isinstance(got[2], NonFiniteOutput) and got[2].error_type == "non_finite_output"
    for index in (0, 1, 3, 4, 5):
        assert got[index].keys() == want[index].keys()
        for name in want[index]:
            np.testing.assert_allclose(got[index][name], want[index][name], atol=1e-5)


def test_a_batch_that_starts_alone_takes_the_lone_session_on_every_thread(tiny_repository: Path) -> None:
    """--cpu-lone-session: a second session on both threads for a batch that starts while none runs, the streams'
    one-thread session for a batch that starts beside another, and the same answers from either."""
    entry = tiny_repository / "bert-ner"
    reference = runtime_for(entry)
    runtime = runtime_for(entry, threads=2, cpu_streams=2, cpu_lone_session="on")
    assert runtime.lone_session is not None
    assert runtime.lone_session.get_session_options().intra_op_num_threads == 2
    assert runtime.session.get_session_options().intra_op_num_threads == 1
    assert runtime.placement_report()["lone_session_threads"] == 2
    used: list[str] = []
    started, release = threading.Event(), threading.Event()
    execute = runtime._execute

    def recording(batch, session):
        used.append("lone" if session is runtime.lone_session else "streams")
        if len(used) == 1 and not release.is_set():  # the first batch holds on until the second has started beside it
            started.set()
            release.wait(10)
        return execute(batch, session)

    runtime._execute = recording  # type: ignore[method-assign]
    rows = random_rows(3, seed=7)
    for want, got in zip(reference.run(rows), runtime.run(rows), strict=True):  # alone: on both threads
        np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-5)
    assert used == ["lone"]

    def beside() -> list[str]:
        """A batch held on its session while another starts; which sessions the two took."""
        used.clear()
        release.clear()
        first = threading.Thread(target=runtime.run, args=(rows,))
        first.start()
        assert started.wait(10)
        second = runtime.run(rows)
        release.set()
        first.join(10)
        started.clear()
        for want, got in zip(reference.run(rows), second, strict=True):
            np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-5)
        return list(used)

    # The share of batches started beside another, after each pair (first alone, second beside it): 0.1, 0.18, 0.25
    for _ in range(3):
        assert beside() == ["lone", "streams"]
    # 0.22 as the next starts: under load a batch that finds none running keeps one thread; after it, 0.30
    assert beside() == ["streams", "streams"]
    release.set()
    used.clear()
    for _ in range(4):
        runtime.run(rows)
    assert used == ["streams", "streams", "streams", "lone"]  # alone again, the share decays: 0.27, 0.24, 0.22, 0.20


@pytest.mark.parametrize(
    "settings", [{"cpu_lone_session": "off"}, {"cpu_lone_session": "on", "cpu_streams": 1}], ids=["off", "one-stream"]
)
def test_no_lone_session_where_it_is_off_or_one_stream_has_every_thread(tiny_repository: Path, settings) -> None:
    runtime = runtime_for(tiny_repository / "bert-classification", **{"threads": 2, **settings})
    assert runtime.lone_session is None
    assert runtime.sessions == [runtime.session]
    assert "lone_session_threads" not in runtime.placement_report()


def test_warm_up_runs_every_shape_on_both_sessions(tiny_repository: Path) -> None:
    runtime = runtime_for(
        tiny_repository / "bert-classification", threads=2, cpu_streams=2, cpu_lone_session="on", **BUCKETS
    )
    ran: list[tuple[int, tuple[int, int]]] = []
    execute = runtime._execute

    def recording(batch, session):
        ran.append((id(session), batch.shape))
        return execute(batch, session)

    runtime._execute = recording  # type: ignore[method-assign]
    assert runtime.warm_up() == len(runtime.warm_up_shapes())
    for session in (runtime.session, runtime.lone_session):
        assert sorted(shape for used, shape in ran if used == id(session)) == sorted(runtime.warm_up_shapes())
