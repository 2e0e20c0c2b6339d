"""Devices: --device cuda:N and --devices 0,1 (one engine per device, front-ends shared out between them, each engine
restarted alone). Only one GPU is ever lent here and none in CI: the settings, the placement of front-ends on
engines and of sessions on devices are tested on the CPU; the engines of a real process-mode server on two
"devices" run on the CPU (--device auto falls back there, each engine on its own)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from bertcore.model_config import ModelConfig
from service.engine import runtime
from service.engine.runtime import CPU, CUDA, ModelRuntime
from service.settings import Settings, settings_from_cli
from service.supervisor.launcher import engine_devices, frontend_engines, resolve_engine_mode, uses_gpu
from tests.service.conftest import wait_for
from tests.service.supervisor.test_process_mode import NO_RESTARTS, SENTENCES, restarts


def test_device_numbers_parse_from_the_flag_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings(device="cuda:3").device_kind, Settings(device="cuda:3").cuda_device_id) == ("cuda", 3)
    assert (Settings().device_kind, Settings().cuda_device_id) == ("auto", 0)
    cli = settings_from_cli(["--device", "cuda", "--devices", "0,1"])
    assert cli.devices == [0, 1] and cli.cuda_device_id == 0
    monkeypatch.setenv("BERTSERVE_DEVICES", "[1]")  # as the launcher hands each engine its device
    assert Settings(device="cuda").cuda_device_id == 1
    monkeypatch.setenv("BERTSERVE_DEVICES", "2,3")
    assert Settings().devices == [2, 3]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"device": "cuda:x"}, "'cuda:x' is not a device: 'cpu', 'cuda' or 'auto', or cuda:N"),
        ({"device": "gpu"}, "is not a device"),
        ({"device": "cpu", "devices": [0, 1]}, "needs --device cuda or auto, not cpu"),
        ({"device": "cuda:1", "devices": [0, 1]}, "names one device and devices lists"),
        ({"devices": [0, 0]}, "lists a device twice"),
        ({"devices": []}, "lists no device"),
        ({"devices": [64]}, "CUDA device numbers are 0-63"),
        ({"devices": [0, 1], "engine_mode": "in-process"}, "one engine per device needs process mode"),
    ],
)
def test_unsafe_device_settings_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Settings(**values)


def test_each_device_gets_an_engine_and_the_front_ends_are_shared_out() -> None:
    assert engine_devices(Settings()) == [None] and engine_devices(Settings(devices=[2, 5])) == [2, 5]
    assert frontend_engines(1, 1) == [0]
    assert frontend_engines(5, 2) == [0, 1, 0, 1, 0]
    assert frontend_engines(1, 3) == [0, 1, 2]  # every engine has a front-end
    assert resolve_engine_mode(Settings(device="auto", devices=[0, 1])) == "process"
    assert resolve_engine_mode(Settings(device="cpu")) == "in-process"


def test_a_session_opens_on_its_engines_device(tiny_repository: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's device_id is the engine's device (at onnxruntime's door: no GPU here)."""
    asked: list[dict] = []
    real_open = runtime.open_session

    def open_session(path: Path, options: Any, providers: list[Any]) -> Any:
        asked.append(dict(providers[0][1]) if isinstance(providers[0], tuple) else {})
        raise RuntimeError("CUDA failure 100: no CUDA-capable device is detected")

    monkeypatch.setattr(runtime, "available_providers", lambda: [CUDA, CPU])
    monkeypatch.setattr(runtime, "open_session", open_session)
    entry = tiny_repository / "bert-classification"
    for settings, device_id in ((Settings(device="cuda:2"), "2"), (Settings(device="cuda", devices=[1]), "1")):
        asked.clear()
        with pytest.raises(runtime.PlacementError):
            ModelRuntime(entry, ModelConfig.read(entry), settings)
        assert asked == [{"device_id": device_id}]
    monkeypatch.setattr(runtime, "open_session", real_open)


def engine_pids(log: str) -> dict[str, list[int]]:
    pids: dict[str, list[int]] = {}
    for device, pid in re.findall(r"engine (\d) started \(pid (\d+)\)", log):
        pids.setdefault(device, []).append(int(pid))
    return pids


def statuses(url: str, count: int) -> list[int]:
    """`count` requests, each on a connection of its own: the kernel spreads them over the front-ends."""
    found = []
    for _ in range(count):
        with httpx.Client(base_url=url, timeout=10) as client:
            found.append(client.post("/v1/models/bert-classification/classify", json={"inputs": SENTENCES}).status_code)
    return found


def test_two_engines_serve_and_one_is_restarted_alone(tiny_repository: Path, server_factory) -> None:
    server = server_factory(
        tiny_repository,
        *("--device", "auto", "--devices", "0,1", "--frontends", "2", "--models", "bert-classification"),
        *("--threads", "1", "--request-timeout-s", "5"),  # requests left in the stopped engine end by then
    )
    assert "process mode: 2 engines (devices 0, 1), 2 front-ends" in server.log()
    if not uses_gpu(Settings()):  # it said nothing of it
        assert "devices [0, 1] lists CUDA devices and none can be used here" in server.log()
    pids = engine_pids(server.log())
    assert set(pids) == {"0", "1"} and all(len(p) == 1 for p in pids.values())
    (first, second) = pids["0"][0], pids["1"][0]
    assert statuses(server.url, 20) == [200] * 20
    # engine 0 silent: its front-end answers 503 once --engine-silence-s has passed, engine 1's keeps serving
    os.kill(first, signal.SIGSTOP)
    try:
        assert wait_for(lambda: 503 in statuses(server.url, 4), timeout=8)
        found = statuses(server.url, 30)
    finally:
        os.kill(first, signal.SIGCONT)
    assert set(found) == {200, 503}, found  # both front-ends got connections, each with its own engine
    os.kill(second, signal.SIGKILL)
    assert wait_for(lambda: len(engine_pids(server.log()).get("1", [])) == 2, timeout=60), server.log()
    assert engine_pids(server.log())["0"] == [first] and Path(f"/proc/{first}").exists()  # left alone
    assert wait_for(lambda: httpx.get(server.url + "/readyz").status_code == 200, timeout=60), server.log()
    for _ in range(10):
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/models/bert-classification/classify", json={"inputs": ["ok"]}).status_code == 200
    assert f"engine 1 (pid {second}) exited with -9; restarting it" in server.log()
    assert restarts(server) == {**NO_RESTARTS, ("engine", "exited"): 1.0}
