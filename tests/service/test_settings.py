"""Settings: defaults < environment < command line; unsafe values refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings, settings_from_cli, unknown_variables
from tests.service.conftest import run_service

ROOT = Path(__file__).resolve().parents[2]


def test_environment_then_command_line(monkeypatch) -> None:
    monkeypatch.setenv("BERTSERVE_MAX_BATCH_SIZE", "7")
    monkeypatch.setenv("BERTSERVE_CPU_VARIANT", "int8")
    assert Settings().max_batch_size == 7
    settings = settings_from_cli(["--max-batch-size", "9", "--no-warmup", "--models", "a,b"])
    assert settings.max_batch_size == 9 and settings.cpu_variant == "int8"
    assert settings.warmup is False and settings.models == ["a", "b"]


def test_lists_from_the_environment_are_comma_separated_or_json(monkeypatch) -> None:
    """BERTSERVE_MODELS=a,b was refused as "not a valid list" (it wanted JSON)."""
    monkeypatch.setenv("BERTSERVE_MODELS", "a, b")
    assert Settings().models == ["a", "b"]
    monkeypatch.setenv("BERTSERVE_MODELS", "single")
    assert Settings().models == ["single"]
    monkeypatch.setenv("BERTSERVE_MODELS", '["c", "d"]')  # as the launcher hands a list on
    assert Settings().models == ["c", "d"]


def test_unknown_variables_are_judged_in_any_case_as_pydantic_settings_reads_them() -> None:
    """bertserve_api_keys is a setting (pydantic-settings ignores the case), bertserve_api_key a misspelt one."""
    assert unknown_variables({"bertserve_api_keys": "x", "Bertserve_Port": "1", "BERTSERVE_MODELS_DIR": "m"}) == (
        None,
        [],
    )
    refusal, _ = unknown_variables({"bertserve_api_key": "x"})
    assert refusal is not None and refusal.startswith("bertserve_api_key is not a setting; did you mean ")
    assert unknown_variables({"BERTSERVE_COLOUR": "blue"})[1] == [
        "BERTSERVE_COLOUR is not a setting and is ignored (python -m service --help lists them)"
    ]


def test_a_short_deadline_alone_shortens_the_default_queue_bound() -> None:
    assert Settings(request_timeout_s=1).max_queue_s == 0.5
    assert Settings().max_queue_s == 2.0


def test_the_queue_cap_in_rows_follows_the_batch_size_unless_given() -> None:
    """A hard cap behind the bound in time: 32 full batches at least. 2,048 rows were 50 ms of H100 work at 256-row
    batches, and a closed loop of 192 connections x 16 inputs got 429s the bound in time would have admitted."""
    assert Settings().max_queue_rows == 2048  # 32-row batches: 1,024 rows would be fewer than before
    assert Settings(max_batch_size=256).max_queue_rows == 8192
    assert Settings(max_batch_size=256, max_queue_rows=100).max_queue_rows == 100
    assert "BERTSERVE_MAX_QUEUE_ROWS" not in Settings(max_batch_size=256).to_env()  # a child derives it again


def test_cpu_streams_default_to_two_where_there_are_two_threads() -> None:
    assert [Settings(threads=n).cpu_stream_count for n in (1, 2, 16)] == [1, 2, 2]
    assert Settings(threads=2, cpu_streams=1).cpu_stream_count == 1
    assert Settings(threads=8, cpu_streams=4).cpu_stream_count == 4


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_batch_tokens": 100, "max_batch_size": 200}, "no batch could ever be full"),
        ({"request_timeout_s": 0.1, "max_wait_ms": 100}, "every request times out"),
        ({"request_timeout_s": 0.001}, "greater than or equal to 0.05"),  # ready, and every request 504
        ({"liveness_stall_s": 0.05}, "greater than or equal to 0.5"),  # 0.2 s beats: failing at rest
        ({"max_queue_rows": 1}, "a request of the most inputs it takes could never be queued"),
        ({"max_queue_rows": 100, "max_inputs_per_request": 200}, r"below max_inputs_per_request \(200\)"),
        ({"request_timeout_s": float("nan")}, "Input should be a finite number"),  # not "less than ... 3600"
        ({"trace_sample_ratio": float("nan")}, "Input should be a finite number"),
        ({"host": ""}, "host\n  Value error, is empty: give an address"),  # uvicorn listened on every interface
        ({"host": " "}, "is empty"),
        ({"repository": ""}, "repository\n  Value error, is empty: give a folder"),  # the current folder
        ({"request_timeout_s": 5, "max_queue_s": 5}, "work admitted to wait that long would time out"),
        ({"port": 70000}, "less than or equal to 65535"),
        ({"device": "tpu"}, "'cpu', 'cuda' or 'auto'"),
        ({"device": "cuda:99"}, "CUDA device numbers are 0-63"),  # --devices capped it, --device did not
        ({"port": "18105.0"}, "'18105.0' is not a whole number"),  # was read as 18105
        ({"max_batch_size": "1_6"}, "'1_6' is not a whole number"),  # Python's int() takes underscores
        ({"otlp_max_queue_spans": "0x10"}, "'0x10' is not a whole number"),
        ({"max_queue_rows": 0}, "greater than or equal to 1"),
        ({"max_qa_windows": 0}, "greater than or equal to 1"),
        ({"release_memory_idle_s": -1}, "greater than or equal to 0"),
        ({"cpu_streams": 3, "threads": 2}, "each stream needs a thread of its own"),
        ({"engine_silence_s": 0.5}, "greater than or equal to 1"),  # 0.2 s beats: a busy engine would flap
        ({"port": 8000, "grpc_port": 8000}, "gRPC needs a port of its own"),
        ({"probe_port": 9000, "grpc_port": 9000}, "gRPC needs a port of its own"),
    ],
)
def test_unsafe_values_are_refused(values: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**values)


def test_help_lists_every_setting_with_its_environment_variable() -> None:
    done = run_service("--help")
    assert done.returncode == 0
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in done.stdout
        assert f"BERTSERVE_{name.upper()}" in done.stdout


def test_a_flag_that_is_no_setting_is_one_line_with_the_one_meant() -> None:
    """argparse printed its 45-line usage, then "unrecognized arguments", and suggested nothing."""
    done = run_service("--max-batchsize", "8")
    assert done.returncode == 2 and done.stderr == (
        "error: --max-batchsize is not a flag; did you mean --max-batch-size? (python -m service --help lists them)\n"
    )
    done = run_service("--frobnicate=1")
    assert done.returncode == 2 and done.stderr.startswith("error: --frobnicate is not a flag (python -m service")


def test_help_is_shown_whatever_the_environment_holds(monkeypatch) -> None:
    monkeypatch.setenv("BERTSERVE_API_KEY", "x")  # refused at start as the misspelt BERTSERVE_API_KEYS: not --help
    done = run_service("--help")
    assert done.returncode == 0 and "--max-batch-size" in done.stdout


def test_bad_flag_value_exits_with_the_reason() -> None:
    done = run_service("--max-batch-size", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: invalid setting max_batch_size (--max-batch-size): Input should be greater than or equal to 1"
    )


def test_a_bad_value_from_the_environment_names_its_variable() -> None:
    """It named the setting alone, and a user looked for a --port never typed."""
    done = run_service(env={"BERTSERVE_PORT": "abc"})
    assert done.returncode == 2
    assert done.stderr.strip().startswith("error: invalid setting port (from BERTSERVE_PORT): "), done.stderr


def test_a_flag_of_explicit_model_control_names_itself_and_what_was_meant() -> None:
    """It said "model and admin_api_key_file are for model_control explicit only" of a --model meant as --models."""
    done = run_service("--model", "sentiment")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --model is for --model-control explicit only (models loaded and unloaded through the API); to "
        "serve only some of the repository's models, name them with --models"
    )


def test_a_repository_that_is_one_entry_says_to_pass_its_parent(tmp_path: Path) -> None:
    """It said "has no entries (build one: python -m export ...)" of a complete entry."""
    entry = tmp_path / "models" / "sentiment"
    entry.mkdir(parents=True)
    (entry / "model.json").write_text("{}")
    done = run_service("--repository", str(entry))
    assert done.returncode == 2
    assert (
        f"is one model's entry (it holds model.json): pass the folder that holds it, --repository {entry.parent}"
        in (done.stderr)
    )


def test_settings_that_clash_are_refused_in_one_plain_line() -> None:
    """A rule across settings has no one field to name: it said "invalid setting settings: Value error, ..."."""
    done = run_service("--grpc-port", "8001", "--probe-port", "8001")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: grpc_port (8001) must differ from port and probe_port: gRPC needs a port of its own"
    )


def test_missing_repository_is_refused_with_the_reason(tmp_path: Path) -> None:
    done = run_service("--repository", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"error: model repository {tmp_path / 'nowhere'} does not exist (build one: python -m export ...)"
    )
    (tmp_path / "a-file").write_text("")  # it said "does not exist" of a file
    done = run_service("--repository", str(tmp_path / "a-file"))
    assert done.returncode == 2 and f"model repository {tmp_path / 'a-file'} is not a folder" in done.stderr
    (tmp_path / "repository").mkdir()
    done = run_service("--repository", str(tmp_path / "repository"), "--models", "")  # it named --model
    assert done.returncode == 2 and done.stderr.startswith("error: --models "), done.stderr


def test_the_launcher_hands_on_only_the_settings_given(monkeypatch) -> None:
    given = Settings(max_batch_size=64, models=["a", "b"], spin_threads=False)
    env = given.to_env()
    assert env == {
        "BERTSERVE_MAX_BATCH_SIZE": "64",
        "BERTSERVE_MODELS": '["a", "b"]',
        "BERTSERVE_SPIN_THREADS": "false",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child == given and child.model_fields_set == given.model_fields_set


def test_a_setting_the_command_line_unsets_is_unset_in_the_children_too(monkeypatch) -> None:
    """The parent's environment has a setting's variable that its command line unset (`--otlp-endpoint ''`): the
    children's environment had it back, so process mode sent traces (and served fewer models) where in-process did
    not. Other variables pass, BERTSERVE_* ones that are no setting too."""
    parent_env = {
        "BERTSERVE_OTLP_ENDPOINT": "http://127.0.0.1:4318/v1/traces",
        "bertserve_models": "a",  # any case, as pydantic-settings reads it
        "BERTSERVE_MAX_BATCH_SIZE": "8",
        "BERTSERVE_SHARED": "/somewhere",
        "PATH": "/usr/bin",
    }
    for name, value in parent_env.items():
        monkeypatch.setenv(name, value)
    parent = Settings(_cli_parse_args=["--otlp-endpoint", "", "--models", "null"])
    assert parent.otlp_endpoint is None and parent.models is None and parent.max_batch_size == 8
    env = parent.child_env(parent_env)
    assert env == {"BERTSERVE_MAX_BATCH_SIZE": "8", "BERTSERVE_SHARED": "/somewhere", "PATH": "/usr/bin"}
    for name in parent_env:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child.otlp_endpoint is None and child.models is None and child.max_batch_size == 8


def test_settings_given_that_do_nothing_beside_the_others_are_said() -> None:
    """An operator's --frontends in-process, --cuda-graphs on the CPU, ... were dropped without a word."""
    given = Settings(
        engine_mode="in-process", frontends=4, cuda_graphs="on", device="cpu", repository_poll_s=1, threads=1
    )
    given_lone = Settings(device="cpu", threads=1, cpu_lone_session="on")
    warnings = given.ineffective("in-process", gpu=False)
    assert [warning.split(" has no effect")[0] for warning in warnings] == [
        "--frontends",
        "--repository-poll-s",
        "--cuda-graphs on",
    ]
    assert given_lone.ineffective("in-process", gpu=False) == [
        "--cpu-lone-session on has no effect with one CPU stream: it is for 2 streams or more"
    ]
    on_gpu = Settings(device="cuda", cpu_streams=2, cpu_lone_session="on", threads=2)
    assert on_gpu.ineffective("process", gpu=True) == [
        "--cpu-streams and --cpu-lone-session have no effect with --device cuda: they are for the CPU"
    ]
    assert Settings(frontends=4, model_control="poll", repository_poll_s=1).ineffective("process", gpu=True) == []
    assert Settings().ineffective("in-process", gpu=False) == []
