"""`python -m loadtests`: a headless Locust run against a bertserve URL, and its report folder.

    python -m loadtests --url http://127.0.0.1:8000 --shape step --step-users 4 --step-seconds 10 \\
        --max-users 32 --max-seconds 90 --report reports/loadtest

The report folder gets: Locust's CSVs (`locust_stats.csv`, `locust_stats_history.csv`, `locust_failures.csv`,
`locust_exceptions.csv`) and HTML report, the request log and stage timings (`requests.csv`, `stages.csv`),
the server's `/metrics` before and after (`metrics_before.prom`, `metrics_after.prom`), per-stage figures
(`stages_summary.csv`), the summary (`summary.json`, `summary.md`) and plots (`throughput.png`,
`latency.png`, `timeline.png`).

Bounded: the load stops at the end of its stages, at --max-seconds or at --max-requests, and Locust is killed
if it is still running 90 s after that. The URL must be a loopback address unless --allow-remote is given.
For a server started with API keys, pass one with --api-key or, better (the command line shows in `ps`), in
BERTSERVE_LOADTEST_API_KEY: every request, the preflight `/v1/models` and the `/metrics` scrapes included, then
carries `Authorization: Bearer KEY`.
Exit status: 0 when every request was answered or shed, 1 when any failed (in a stage's settling seconds too; a
request still unanswered when the load stopped counts as failed), 2 for bad options, an unreachable server, a
refused key or a server that is not bertserve, 3 when Locust ended without a request log; 130 (SIGINT, Ctrl-C) or
143 (SIGTERM) after writing the report of what ran until then (`stop_reason` says so).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

from loadtests.payloads import ENDPOINTS, BatchSizes, PayloadError, load_payloads, parse_batch_sizes
from loadtests.report import (
    endpoint_totals,
    markdown,
    metrics_delta,
    parse_prometheus,
    read_requests,
    read_stages,
    scrape_warning,
    stage_stats,
    stats_rows,
    summarize,
)
from loadtests.shapes import STOP_TIMEOUT_S, Schedule, parse_rates, rate_schedule, step_schedule
from loadtests.urls import API_KEY_ENV, check_target, fetch_models, http_get
from loadtests.validation import ModelTarget, pick_target

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
USER_CLASSES = {"classify": "ClassifyUser", "ner": "NerUser", "qa": "QaUser"}
KILL_GRACE_S = 90.0
SCRAPE_FAILED = "# scrape failed: "
STOP_GRACE_S = 30.0  # after a SIGINT or SIGTERM of the run: Locust's own stop (--stop-timeout 10) and its writes
MAX_SECONDS_LIMIT = 3600.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests",
        description="Headless Locust load test of a bertserve server, with a report folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--allow-remote", action="store_true", help="allow a URL that is not a loopback address")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"API key of a server started with keys, sent as `Authorization: Bearer KEY` on every request; "
        f"none: the environment variable {API_KEY_ENV} (better than the command line, which ps shows)",
    )
    parser.add_argument("--report", type=Path, default=Path("reports/loadtest"), help="report folder (created)")
    parser.add_argument(
        "--endpoints", default="auto", help="comma-separated among classify,ner,qa; auto: each with a ready model"
    )
    for endpoint in ENDPOINTS:
        parser.add_argument(
            f"--{endpoint}-model", default=None, help=f"model for /{endpoint}; none: the first ready model of its task"
        )
    parser.add_argument("--payloads", default="builtin", help="builtin, shared (../shared/data) or a JSON file")
    parser.add_argument(
        "--payload-limit",
        type=int,
        default=0,
        help="only the first N texts (QA: pairs) of each endpoint's set, whatever the source (0: all)",
    )
    parser.add_argument("--batch", default="mix", help="inputs per request: mix (60%% 1, 30%% 2-4, 10%% 5-16), N, A-B")
    parser.add_argument("--shape", choices=["step", "rate"], default="step", help="step load or constant arrival rate")
    parser.add_argument("--step-users", type=int, default=2, help="step: users added per step (and the first step)")
    parser.add_argument("--step-seconds", type=float, default=10.0, help="step: seconds per step")
    parser.add_argument("--max-users", type=int, default=16, help="step: users of the last step")
    parser.add_argument("--rates", default="10", help="rate: requests/s per stage, comma-separated")
    parser.add_argument("--stage-seconds", type=float, default=20.0, help="rate: seconds per rate")
    parser.add_argument("--rate-users", type=int, default=0, help="rate: users sharing the rate (0: from the rate)")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="hard stop of the load")
    parser.add_argument(
        "--max-requests",
        type=int,
        default=200_000,
        help="stop once this many requests completed (checked every second)",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=2.0,
        help="left out of each stage's rates and latencies at its start (its failures still count)",
    )
    parser.add_argument("--metric", choices=["requests", "sequences"], default="requests", help="saturation by")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="print only the report folder")
    return parser


def schedule_from(args: argparse.Namespace) -> Schedule:
    if args.shape == "step":
        return step_schedule(args.step_users, args.step_seconds, args.max_users, args.max_seconds)
    return rate_schedule(parse_rates(args.rates), args.stage_seconds, args.rate_users or None, args.max_seconds)


def choose_targets(models: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, ModelTarget]:
    wanted = list(ENDPOINTS) if args.endpoints == "auto" else [e.strip() for e in args.endpoints.split(",")]
    unknown = [e for e in wanted if e not in ENDPOINTS]
    if unknown:
        raise ValueError(f"--endpoints: unknown {unknown}; choose among {', '.join(ENDPOINTS)}")
    targets = {}
    for endpoint in wanted:
        target = pick_target(models, endpoint, getattr(args, f"{endpoint}_model"))
        if target is not None:
            targets[endpoint] = target
        elif args.endpoints != "auto":
            raise ValueError(f"--endpoints {endpoint}: the server has no ready {endpoint} model")
    if not targets:
        raise ValueError("the server has no ready model for any of the endpoints " + ", ".join(wanted))
    return targets


def locust_command(args: argparse.Namespace, url: str, targets: dict[str, ModelTarget], report: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "--host",
        url,
        "--csv",
        str(report / "locust"),
        "--csv-full-history",
        "--html",
        str(report / "locust.html"),
        "--logfile",
        str(report / "locust.log"),
        "--stop-timeout",
        f"{STOP_TIMEOUT_S:g}",
        "--payloads",
        args.payloads,
        "--payload-limit",
        str(args.payload_limit),
        "--batch",
        args.batch,
        "--load-shape",
        args.shape,
        "--step-users",
        str(args.step_users),
        "--step-seconds",
        str(args.step_seconds),
        "--max-users",
        str(args.max_users),
        "--rates",
        args.rates,
        "--stage-seconds",
        str(args.stage_seconds),
        "--rate-users",
        str(args.rate_users),
        "--max-seconds",
        str(args.max_seconds),
        "--max-requests",
        str(args.max_requests),
        "--report-dir",
        str(report),
        "--seed",
        str(args.seed),
    ]
    if args.allow_remote:
        command.append("--allow-remote")
    for endpoint, target in targets.items():
        command += [f"--{endpoint}-model", target.name]
    if len(targets) == 1:
        return command + [USER_CLASSES[endpoint] for endpoint in targets]
    # one class taking the endpoints in turn: a class per endpoint made a stage of 1 user classify alone, of 2
    # classify and NER, so the step shape's stages compared different mixes
    return [*command, "--mix", ",".join(targets), "MixedUser"]


def run_locust(
    command: list[str], report: Path, timeout_s: float, api_key: str | None = None
) -> tuple[int, str | None]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.pop(API_KEY_ENV, None)
    if api_key:  # by the environment, not the command line (ps, locust_command.txt)
        env[API_KEY_ENV] = api_key
    with (report / "locust.out").open("w") as output:
        # a session of its own: a terminal's Ctrl-C reaches this process alone, which stops Locust as SIGTERM does
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # SIGINT as Python's default (KeyboardInterrupt) in Locust, which is how the runner stops it: a runner
            # started in the background by a script (`... &`) has SIGINT ignored, Locust inherited that, went on
            # loading to its 30 s kill and wrote nothing
            preexec_fn=_default_sigint,
        )
        return wait_for_locust(process, timeout_s)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_locust(process: subprocess.Popen, timeout_s: float) -> tuple[int, str | None]:
    """Locust's exit status, and the signal (SIGINT, SIGTERM) that interrupted the run, if any: Locust is then told
    to stop (SIGINT: it writes its request log and CSVs as at a normal end) and killed if still running
    STOP_GRACE_S later. The runner had died at once (a KeyboardInterrupt traceback; on SIGTERM Locust went on
    loading the server, orphaned) and no report was written."""
    interrupted: list[str] = []

    def stop(signum: int, _frame: Any) -> None:
        if not interrupted:
            interrupted.append(signal.Signals(signum).name)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)  # Locust died of a SIGTERM outright, writing nothing

    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if interrupted:
                deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
            try:
                return process.wait(max(0.0, min(0.5, deadline - time.monotonic()))), (interrupted or [None])[0]
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    process.kill()
                    process.wait(10)
                    return -9, (interrupted or [None])[0]
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def scrape(url: str, path: Path, api_key: str | None = None) -> None:
    try:
        text = http_get(url + "/metrics", api_key=api_key).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as error:
        text = f"{SCRAPE_FAILED}{error}\n"
    path.write_text(text)


def write_report(report: Path, run: dict[str, Any], settle_s: float, metric: str) -> dict[str, Any]:
    """Stage figures, summary (JSON, Markdown) and plots from the files the Locust run left in `report`."""
    from loadtests import plots  # matplotlib: imported when there is something to plot

    records = read_requests(report / "requests.csv")
    stages = read_stages(report / "stages.csv")
    stats = stage_stats(records, stages, settle_s)
    summary = summarize(stats, metric, records)  # type: ignore[arg-type]
    summary["endpoints"] = endpoint_totals(records)
    after = (report / "metrics_after.prom").read_text()
    summary["server"] = metrics_delta(
        parse_prometheus((report / "metrics_before.prom").read_text()), parse_prometheus(after)
    )
    if after.startswith(SCRAPE_FAILED):  # the server died or hung meanwhile: said, not an empty section
        run["server_scrape_failed"] = after.removeprefix(SCRAPE_FAILED).strip()
        summary["warnings"].append(scrape_warning(run["server_scrape_failed"]))
    summary["run"] = run
    summary["stage_figures"] = stats_rows(stats)
    rows = stats_rows(stats)
    with (report / "stages_summary.csv").open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]) if rows else ["index"])
        writer.writeheader()
        writer.writerows(rows)
    (report / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (report / "summary.md").write_text(markdown(summary, stats, run))
    unit = run["offered_unit"]
    plots.throughput_plot(stats, summary, unit, report / "throughput.png")
    plots.latency_plot(stats, unit, report / "latency.png")
    plots.timeline_plot(records, stages, report / "timeline.png")
    return summary


def redacted(argv: list[str]) -> list[str]:
    """The command line with the value of --api-key hidden (it goes into the report)."""
    shown, hide = [], False
    for arg in argv:
        if hide:
            shown.append("REDACTED")
        elif arg.startswith("--api-key="):
            shown.append("--api-key=REDACTED")
        else:
            shown.append(arg)
        hide = arg == "--api-key"
    return shown


def check_options(args: argparse.Namespace) -> None:
    """ValueError for a value out of range (before anything is sent)."""
    if not 0 < args.max_seconds <= MAX_SECONDS_LIMIT:
        raise ValueError(f"--max-seconds must be in (0, {MAX_SECONDS_LIMIT:g}]")
    if args.max_requests < 1:
        raise ValueError("--max-requests must be at least 1")
    if args.payload_limit < 0:
        raise ValueError(f"--payload-limit must be 0 (all) or more, not {args.payload_limit}")
    if not args.settle_seconds >= 0:  # NaN too
        raise ValueError(f"--settle-seconds must be 0 or more, not {args.settle_seconds:g}")
    report: Path = args.report
    if report.exists() and not report.is_dir():
        raise ValueError(f"--report {report}: exists and is not a folder")


def make_report_folder(report: Path) -> Path:
    """The report folder, created (with its parents); ValueError saying why when it cannot be."""
    try:
        report.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--report {report}: cannot create the folder: {error.strerror or error}") from None
    if not os.access(report, os.W_OK | os.X_OK):
        raise ValueError(f"--report {report}: the folder is not writable")
    return report


def check_batch_limit(batch: BatchSizes, names: list[str], models: list[dict[str, Any]]) -> None:
    """ValueError where a request of --batch's largest size exceeds a target model's input limit (as /v1/models
    gives it): every such request was a 422, and the run a list of failures."""
    for model in models:
        limit = (model.get("limits") or {}).get("max_inputs_per_request")
        if model.get("name") in names and isinstance(limit, int) and batch.largest > limit:
            raise ValueError(
                f"--batch {batch.spec}: requests of up to {batch.largest} inputs, but model {model['name']} takes "
                f"{limit} at most (the server's --max-inputs-per-request): the larger ones would all be 422"
            )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        url = check_target(args.url, args.allow_remote)
        check_options(args)
        schedule = schedule_from(args)
        batch = parse_batch_sizes(args.batch)
        payloads = load_payloads(args.payloads, args.payload_limit or None)
        models = fetch_models(url, args.api_key)
        targets = choose_targets(models, args)
        check_batch_limit(batch, [target.name for target in targets.values()], models)
        report = make_report_folder(args.report.resolve())
    except (ValueError, PayloadError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError) as error:
        print(f"error: cannot reach {args.url}: {error}", file=sys.stderr)
        return 2

    if args.payloads not in ("builtin", "shared"):
        args.payloads = str(Path(args.payloads).resolve())  # Locust runs from the project root
    for stale in ("requests.csv", "stages.csv", "locust_run.json", "summary.json", "summary.md"):
        (report / stale).unlink(missing_ok=True)
    command = locust_command(args, url, targets, report)
    (report / "locust_command.txt").write_text(shlex.join(command) + "\n")
    if not args.quiet:
        print(
            f"load test: {args.shape}, {len(schedule.stages)} stages, {schedule.duration_s:.0f} s, against {url} "
            f"({', '.join(f'{e}: {t.name}' for e, t in targets.items())}), payloads {payloads.source} "
            f"{payloads.sizes()}; report in {report}",
            file=sys.stderr,
        )
    scrape(url, report / "metrics_before.prom", args.api_key)
    started = time.monotonic()
    locust_rc, interrupted = run_locust(command, report, schedule.duration_s + KILL_GRACE_S, args.api_key)
    seconds = time.monotonic() - started
    scrape(url, report / "metrics_after.prom", args.api_key)
    if not (report / "requests.csv").is_file() or not (report / "stages.csv").is_file():
        tail = (report / "locust.out").read_text(errors="replace")[-2000:]
        print(f"error: Locust exited with {locust_rc} without a request log; its output ends:\n{tail}", file=sys.stderr)
        return 3
    locust_run = json.loads((report / "locust_run.json").read_text())
    run = {
        "command": shlex.join(["python", "-m", "loadtests", *redacted(sys.argv[1:] if argv is None else argv)]),
        "url": url,
        "models": {endpoint: target.name for endpoint, target in targets.items()},
        "shape": args.shape,
        "offered_unit": schedule.offered_unit,
        "payloads": payloads.source,
        "payload_sizes": payloads.sizes(),
        "payload_chars": payloads.length_stats(),
        "batch": args.batch,
        "settle_seconds": args.settle_seconds,
        "seconds": round(seconds, 1),
        "stop_reason": f"interrupted ({interrupted})" if interrupted else locust_run["stop_reason"],
        "locust_exit_code": locust_rc,
    }
    if interrupted:  # Locust itself saw its schedule end (it was told to stop): the file says why it ended
        locust_run["stop_reason"] = run["stop_reason"]
        (report / "locust_run.json").write_text(json.dumps(locust_run, indent=2) + "\n")
    summary = write_report(report, run, args.settle_seconds, args.metric)
    if args.quiet:
        print(report)
    else:
        print((report / "summary.md").read_text())
    if interrupted:  # the report of what ran, then the shell's status for the signal (130, 143)
        print(f"interrupted ({interrupted}): the report holds what ran until then", file=sys.stderr)
        return 128 + signal.Signals[interrupted].value
    return 1 if summary["totals"]["failed"] else 0
