"""A real engine process (`python -m service.engine`) driven over its unix socket as a front-end drives it: answers
by id, domain errors as error frames, hostile bytes that close only their own connection, and SIGTERM that answers
the requests in flight before the engine exits."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.wire import frames
from tests.harness.environment import offline_env
from tests.service.conftest import ROOT, wait_for

MODELS = ["bert-classification", "bert-ner"]
REQUESTS = 200  # of 8 rows: 1,600 rows, within the queue's bound


class EngineProcess:
    def __init__(self, repository: Path, workdir: Path) -> None:
        self.socket = workdir / "engine.sock"
        metrics = workdir / "metrics"
        metrics.mkdir()
        env = offline_env(
            {
                "PROMETHEUS_MULTIPROC_DIR": str(metrics),
                "BERTSERVE_REPOSITORY": str(repository),
                "BERTSERVE_MODELS": json.dumps(MODELS),
                "BERTSERVE_DEVICE": "cpu",
                "BERTSERVE_THREADS": "1",
            }
        )
        self.log = workdir / "engine.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.engine", "--socket", str(self.socket)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def ready(self) -> bool:
        async def ask() -> bool:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.socket))
            except OSError:
                return False
            try:
                while True:
                    frame = await asyncio.wait_for(frames.read_frame(reader), 2.0)
                    if frame.header["op"] == "state" and frame.header["ready"]:
                        return True
            except (TimeoutError, asyncio.IncompleteReadError):
                return False
            finally:
                writer.close()

        assert self.process.poll() is None, self.log.read_text()
        return asyncio.run(ask())


@pytest.fixture(scope="module")
def engine(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    engine = EngineProcess(tiny_repository, tmp_path_factory.mktemp("engine"))
    try:
        assert wait_for(engine.ready, timeout=120, every_s=0.2), engine.log.read_text()
        yield engine
    finally:
        engine.process.kill()
        engine.process.wait(10)


class Connection:
    """One front-end's socket: frames out, answers (result and error frames) by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.answers: dict[int, frames.Frame] = {}

    @classmethod
    async def open(cls, engine: EngineProcess) -> Connection:
        return cls(*await asyncio.open_unix_connection(str(engine.socket)))

    def infer(self, request_id: int, model: str, lengths: list[int], timeout: float = 10.0) -> None:
        ids = [np.arange(5, 5 + n) % 90 + 5 for n in lengths]  # the tiny vocabulary's ordinary tokens
        arrays = frames.pack_rows(ids, [np.zeros(n, np.int64) for n in lengths])
        self.writer.write(frames.encode_infer(request_id, model, timeout, lengths, f"http-{request_id}", arrays))

    async def answers_for(self, ids: set[int]) -> dict[int, frames.Frame]:
        while not ids <= self.answers.keys():
            frame = await asyncio.wait_for(frames.read_frame(self.reader), 30)
            if frame.header["op"] in ("result", "error"):
                self.answers[frame.header["id"]] = frame
        return {i: self.answers[i] for i in ids}


def test_requests_are_answered_by_id_alike_alone_or_batched(engine: EngineProcess) -> None:
    async def main() -> None:
        connection = await Connection.open(engine)
        connection.infer(1, "bert-classification", [4, 9, 6])
        connection.infer(2, "bert-ner", [3, 7])
        for i, n in enumerate([4, 9, 6]):
            connection.infer(10 + i, "bert-classification", [n])
        answers = await connection.answers_for({1, 2, 10, 11, 12})
        together = answers[1]
        assert together.header["op"] == "result" and not together.header["per_token"]
        assert together.header["timings"]["inference_calls"] >= 1
        assert together.header["timings"]["inference_s"] > 0
        logits = together.arrays["logits"]
        assert logits.shape[0] == 3 and logits.dtype == np.float32
        for i in range(3):  # each row as its own request: the same logits, whatever batch it landed in
            alone = answers[10 + i].arrays["logits"]
            assert alone.shape == (1, logits.shape[1])
            np.testing.assert_allclose(alone[0], logits[i], rtol=1e-4, atol=1e-5)
        ner = answers[2]
        assert ner.header["per_token"] and all(a.shape[0] == 3 + 7 for a in ner.arrays.values())
        connection.writer.close()

    asyncio.run(main())


def test_domain_errors_come_back_as_error_frames_and_the_engine_serves_on(engine: EngineProcess) -> None:
    async def main() -> None:
        connection = await Connection.open(engine)
        connection.infer(1, "no-such-model", [3])
        connection.infer(2, "bert-classification", [3], timeout=-1.0)  # its deadline has passed: never run
        connection.infer(3, "bert-classification", [3])
        answers = await connection.answers_for({1, 2, 3})
        assert answers[1].header["op"] == "error" and answers[1].header["kind"] == "ModelNotFound"
        assert answers[2].header["op"] == "error" and answers[2].header["kind"] == "DeadlineExceeded"
        assert answers[3].header["op"] == "result"
        connection.writer.close()

    asyncio.run(main())


def test_hostile_bytes_close_only_their_own_connection(engine: EngineProcess) -> None:
    async def main() -> None:
        good, bad = await Connection.open(engine), await Connection.open(engine)
        frame = bytearray(
            frames.encode_infer(
                1,
                "bert-classification",
                10.0,
                [2, 3],
                None,
                {"input_ids": np.full(5, 7), "token_type_ids": np.zeros(5)},
            )
        )
        frame[frames.PREFIX.size + frames.INFER_HEAD.size + len("bert-classification")] = 0xFF  # lengths lie
        bad.writer.write(bytes(frame))
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            while True:  # the state frame, perhaps a beat, then the end: the engine closed this connection
                await asyncio.wait_for(frames.read_frame(bad.reader), 10)
        good.infer(1, "bert-classification", [5])
        answers = await good.answers_for({1})
        assert answers[1].header["op"] == "result"
        good.writer.close()

    asyncio.run(main())
    assert engine.process.poll() is None
    assert "cannot be read; closing it" in engine.log.read_text()


def test_sigterm_answers_the_requests_in_flight_then_exits(tiny_repository: Path, tmp_path: Path) -> None:
    engine = EngineProcess(tiny_repository, tmp_path)
    try:
        assert wait_for(engine.ready, timeout=120, every_s=0.2), engine.log.read_text()

        async def main() -> tuple[int, dict[int, frames.Frame]]:
            connection = await Connection.open(engine)
            for i in range(REQUESTS):
                connection.infer(i, "bert-classification", [60] * 8)
            collecting = asyncio.create_task(connection.answers_for(set(range(REQUESTS))))
            while not connection.answers:  # the engine is at work on them
                await asyncio.sleep(0.001)
            engine.process.send_signal(signal.SIGTERM)
            answered_before = len(connection.answers)
            return answered_before, await collecting

        answered_before, answers = asyncio.run(main())
        assert answered_before < REQUESTS  # some were still queued or running when SIGTERM came
        assert {frame.header["op"] for frame in answers.values()} == {"result"}
        assert engine.process.wait(30) == 0
    finally:
        engine.process.kill()
        engine.process.wait(10)
