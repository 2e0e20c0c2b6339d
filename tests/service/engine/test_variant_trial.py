"""--cpu-variant auto by measurement: of fp32 and int8 (where int8 is within its accuracy budget), the one faster on
this CPU, timed at load on real sessions; int8 only where it is at least INT8_MIN_SPEED_UP as fast."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from bertcore.model_config import ModelConfig
from service.engine import runtime
from service.engine.core import EngineCore
from service.engine.runtime import INT8_MIN_SPEED_UP, TRIAL_MIN_ROUNDS, ModelRuntime, choose_by_timing
from service.metrics import Metrics
from service.settings import Settings


@pytest.mark.parametrize(
    ("fp32_ms", "int8_ms", "chosen"),
    [
        (10.0, 5.0, "int8"),  # AVX-512 VNNI: int8 about twice as fast
        (10.0, 10.0 / INT8_MIN_SPEED_UP, "int8"),  # just enough
        (10.0, 9.9, "fp32"),  # 1.01x: the AVX2-only CPU of 2026-11-26
        (10.0, 10.4, "fp32"),  # 0.96x
    ],
)
def test_the_choice_follows_the_timings(fp32_ms: float, int8_ms: float, chosen: str) -> None:
    variant, why = choose_by_timing({"fp32": fp32_ms, "int8": int8_ms})
    assert variant == chosen
    assert why.startswith(f"int8 ran {fp32_ms / int8_ms:.2f}x as fast as fp32 on this CPU")


@pytest.fixture(scope="module")
def within_budget(tiny_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny NER entry whose int8 the export measured within its accuracy budget (as `--eval` records it)."""
    entry = tmp_path_factory.mktemp("trial") / "ner"
    shutil.copytree(tiny_repository / "bert-ner", entry)
    config = json.loads((entry / "model.json").read_text())
    config["variants"]["int8"]["accuracy"] = {"measured": True, "within_budget": True, "loss_points": 0.1}
    (entry / "model.json").write_text(json.dumps(config))
    return entry


def open_runtime(entry: Path, **settings: Any) -> ModelRuntime:
    return ModelRuntime(entry, ModelConfig.read(entry), Settings(device="cpu", threads=1, **settings))


def test_auto_times_both_variants_on_real_sessions_and_serves_the_faster(within_budget: Path) -> None:
    started = time.perf_counter()
    model = open_runtime(within_budget, cpu_variant_trial_s=0.3)
    took = time.perf_counter() - started
    trial = model.variant_trial
    assert trial is not None and trial["candidates"] == ["fp32", "int8"]
    assert set(trial["ms_per_batch"]) == {"fp32", "int8"} and all(ms > 0 for ms in trial["ms_per_batch"].values())
    assert trial["batch"] == [16, 64]  # 16 rows at the model's whole length (64 < 128)
    assert trial["rounds"] >= TRIAL_MIN_ROUNDS and trial["seconds"] < 2.0 and took < 5.0  # bounded
    assert (trial["chosen"], trial["why"]) == choose_by_timing(trial["ms_per_batch"])
    assert model.variant == trial["chosen"]
    assert Path(model.session._model_path).name == f"model.{trial['chosen']}.onnx"  # the loser is dropped


def slowed(variant: str, delay_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions of `variant` run `delay_s` slower: a CPU where that variant does not pay (at onnxruntime's door)."""
    real_open = runtime.open_session

    class Slower:
        def __init__(self, session: Any) -> None:
            self._session = session

        def run(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(delay_s)
            return self._session.run(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._session, name)

    def open_session(path: Path, options: Any, providers: list[Any]) -> Any:
        session = real_open(path, options, providers)
        return Slower(session) if path.name == f"model.{variant}.onnx" else session

    monkeypatch.setattr(runtime, "open_session", open_session)


@pytest.mark.parametrize(("slow", "served"), [("int8", "fp32"), ("fp32", "int8")])
def test_the_variant_that_is_slower_here_is_not_served(
    within_budget: Path, monkeypatch: pytest.MonkeyPatch, slow: str, served: str
) -> None:
    slowed(slow, 0.02, monkeypatch)
    model = open_runtime(within_budget, cpu_variant_trial_s=0.05)
    assert model.variant == served and model.variant_trial is not None
    assert model.variant_trial["chosen"] == served
    assert model.variant_trial["rounds"] == TRIAL_MIN_ROUNDS  # 3 rounds of 20 ms already pass 0.05 s
    assert model.variant_trial["ms_per_batch"][slow] > 20


def test_no_timing_where_there_is_nothing_to_choose(tiny_repository: Path, within_budget: Path) -> None:
    unmeasured = open_runtime(tiny_repository / "bert-ner")  # int8 without an accuracy record: fp32, no timing
    assert unmeasured.variant == "fp32" and unmeasured.variant_trial is None
    named = open_runtime(within_budget, cpu_variant="int8")
    assert named.variant == "int8" and named.variant_trial is None
    untimed = open_runtime(within_budget, cpu_variant_trial_s=0)  # by accuracy alone
    assert untimed.variant == "int8" and untimed.variant_trial is None


def test_the_trial_is_in_the_models_state(within_budget: Path) -> None:
    settings = Settings(device="cpu", threads=1, repository=within_budget.parent, cpu_variant_trial_s=0.1)
    core = EngineCore(settings, Metrics())
    core.load()
    state = core.model_reports()["ner"]
    assert state["cpu_variant_trial"]["chosen"] == state["variant"]
    assert state["placement"]["provider"] == "CPUExecutionProvider"
