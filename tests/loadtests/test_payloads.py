"""Payload sources, batch sizes, request bodies, load schedules and the loopback rule (no Locust, no server)."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from loadtests import payloads
from loadtests.payloads import (
    PayloadError,
    QaPair,
    builtin_payloads,
    classify_body,
    load_payloads,
    ner_body,
    parse_batch_sizes,
    qa_body,
    sample,
)
from loadtests.shapes import default_rate_users, pacing_wait, rate_schedule, step_schedule
from loadtests.urls import check_target, is_loopback_url

SHARED_DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_builtin_set_has_realistic_lengths() -> None:
    built = builtin_payloads()
    assert built.sizes()["classify"] >= 30 and built.sizes()["ner"] >= 25 and built.sizes()["qa"] >= 20
    words = [len(text.split()) for text in built.classify]
    assert min(words) <= 3 and max(words) >= 40 and 10 <= statistics.mean(words) <= 25  # SST-2-like spread
    ner_words = [len(text.split()) for text in built.ner]
    assert min(ner_words) <= 6 and max(ner_words) >= 30
    contexts = [len(pair.context.split()) for pair in built.qa]
    assert min(contexts) >= 40 and max(contexts) >= 150
    assert all(text.strip() for text in (*built.classify, *built.ner))
    assert all(pair.question.endswith("?") for pair in built.qa)
    stats = built.length_stats()
    assert stats["classify"]["min"] < stats["classify"]["mean"] < stats["classify"]["max"]


@pytest.mark.shared
@pytest.mark.skipif(not (SHARED_DATA / "sst2" / "dev.tsv").is_file(), reason="../shared/data is absent")
def test_shared_payloads_read_the_real_sets() -> None:
    shared = load_payloads("shared", limit=50)
    assert shared.source == "shared"
    assert 40 <= len(shared.classify) <= 50 and 40 <= len(shared.ner) <= 50 and len(shared.qa) == 50
    assert all(isinstance(pair, QaPair) and pair.context for pair in shared.qa)


def test_shared_payloads_explain_a_missing_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    realdata = payloads._realdata()
    monkeypatch.setattr(realdata, "SHARED", tmp_path / "nowhere")
    with pytest.raises(PayloadError, match="--payloads shared needs the real data sets"):
        load_payloads("shared")


def test_payload_file_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "texts.json"
    good.write_text(json.dumps({"classify": ["one", "two"], "qa": [{"question": "Who?", "context": "Ann did."}]}))
    loaded = load_payloads(str(good))
    assert loaded.classify == ("one", "two")
    assert loaded.ner == builtin_payloads().ner  # a key left out: the built-in texts
    assert loaded.qa == (QaPair("Who?", "Ann did."),)
    for content, reason in (
        ("not json", "cannot read"),
        (json.dumps({"classify": []}), "non-empty list"),
        (json.dumps({"summarize": ["x"]}), "keys among"),
        (json.dumps({"qa": [{"question": "q"}]}), "question, context"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(PayloadError, match=reason):
            load_payloads(str(bad))
    with pytest.raises(PayloadError, match="expected builtin, shared or a JSON file"):
        load_payloads("squad")


def test_payload_limit_cuts_every_source(tmp_path: Path) -> None:
    limited = load_payloads("builtin", limit=3)
    assert limited.sizes() == {"classify": 3, "ner": 3, "qa": 3}
    assert limited.classify == builtin_payloads().classify[:3] and limited.qa == builtin_payloads().qa[:3]
    assert load_payloads("builtin", limit=0).sizes() == builtin_payloads().sizes()  # 0: all
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps({"classify": ["one", "two", "three"], "ner": ["Ann in Paris."]}))
    from_file = load_payloads(str(texts), limit=2)
    assert from_file.classify == ("one", "two") and from_file.ner == ("Ann in Paris.",) and len(from_file.qa) == 2
    with pytest.raises(PayloadError, match="--payload-limit must be 0"):
        load_payloads("builtin", limit=-1)


def test_batch_sizes() -> None:
    rng = random.Random(0)
    mix = parse_batch_sizes("mix")
    draws = [mix.draw(rng) for _ in range(4000)]
    assert min(draws) == 1 and max(draws) == 16 and mix.largest == 16
    assert 0.55 < draws.count(1) / len(draws) < 0.65  # mostly single inputs
    assert 0.05 < sum(1 for d in draws if d >= 5) / len(draws) < 0.15
    assert parse_batch_sizes("8").draw(rng) == 8
    assert {parse_batch_sizes("2-4").draw(rng) for _ in range(200)} == {2, 3, 4}
    assert parse_batch_sizes("1-16").mean() == 8.5
    for spec in ("0", "5-2", "x", "1-65", "-3"):
        with pytest.raises(ValueError, match="batch sizes"):
            parse_batch_sizes(spec)


def test_request_bodies() -> None:
    rng = random.Random(1)
    texts = sample(builtin_payloads().classify, 5, rng)
    assert len(texts) == 5
    assert classify_body(texts) == {"inputs": texts, "top_k": None}
    assert ner_body(["a"]) == {"inputs": ["a"], "aggregation_strategy": "simple"}
    assert qa_body([QaPair("q?", "c.")], top_k=2) == {"inputs": [{"question": "q?", "context": "c."}], "top_k": 2}
    assert qa_body([QaPair("q?", "c.")], doc_stride=8)["doc_stride"] == 8


def test_step_schedule_is_bounded() -> None:
    schedule = step_schedule(step_users=4, step_seconds=10, max_users=14, max_seconds=100)
    assert [s.users for s in schedule.stages] == [4, 8, 12, 14]
    assert schedule.duration_s == 40 and [s.offered for s in schedule.stages] == [4, 8, 12, 14]
    assert schedule.stage_at(0).users == 4 and schedule.stage_at(19.9).users == 8
    assert schedule.stage_at(40) is None
    clipped = step_schedule(step_users=2, step_seconds=10, max_users=100, max_seconds=25)
    assert [(s.start_s, s.end_s, s.users) for s in clipped.stages] == [(0, 10, 2), (10, 20, 4), (20, 25, 6)]
    with pytest.raises(ValueError):
        step_schedule(step_users=0, step_seconds=1, max_users=1, max_seconds=1)


def test_rate_schedule_and_pacing() -> None:
    schedule = rate_schedule([5, 20], stage_seconds=10, users=None, max_seconds=60)
    assert [(s.rate, s.users, s.offered) for s in schedule.stages] == [(5, 10, 5), (20, 10, 20)]
    assert default_rate_users([1]) == 4 and default_rate_users([10_000]) == 256
    assert schedule.offered_unit == "target requests/s"
    with pytest.raises(ValueError):
        rate_schedule([0], stage_seconds=1, users=1, max_seconds=1)
    assert pacing_wait(0.5, now=10.0, last_start=None, phase=0.2) == 0.2
    assert pacing_wait(0.5, now=10.1, last_start=10.0, phase=0.0) == pytest.approx(0.4)
    assert pacing_wait(0.5, now=12.0, last_start=10.0, phase=0.0) == 0.0  # behind: go at once, no burst


def test_only_loopback_targets_unless_allowed() -> None:
    for url in ("http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:80", "http://127.1.2.3/"):
        assert is_loopback_url(url)
    for url in ("http://10.0.0.1:8000", "http://example.com", "ftp://127.0.0.1", "127.0.0.1:8000"):
        assert not is_loopback_url(url)
    assert check_target("http://127.0.0.1:8000/", allow_remote=False) == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="--allow-remote"):
        check_target("http://192.168.1.5:8000", allow_remote=False)
    assert check_target("http://192.168.1.5:8000", allow_remote=True) == "http://192.168.1.5:8000"
    with pytest.raises(ValueError, match="expected http"):
        check_target("localhost:8000", allow_remote=True)
