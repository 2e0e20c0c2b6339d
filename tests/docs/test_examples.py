"""The README's and docs/'s commands run against a real demo server, so that they cannot drift from the code.

The convention, for README.md and every docs/*.md page:
- every fenced block names its language; `bash`, `sh`, `console` (commands after `$ `) and `python` blocks are
  examples, and are run here;
- an HTML comment `<!-- not-run: REASON -->` on the line before a block (a blank line between is allowed) keeps
  it from being run: docker, kubectl, a GPU, ../shared's real checkpoints, a server that runs until stopped. The
  reason is required;
- `<!-- expect-status: CODE -->` before a block names the HTTP status its curl calls get (default: any 2xx).

Run here, against one demo server (`python -m export demo`, as docs/export.md builds it, then `python -m service`
on a free loopback port): every curl call (its `localhost:8000` pointed at that server), every python block, and
every `python -m MODULE --help`. Any other command in a block that is run fails the test: mark it not-run with its
reason. In every command block, run or not, each `--flag` given to `python -m service`, `python -m export`,
`python -m loadtests` or `python -m benchmarks.X` must be one that the module's `--help` lists. And every relative
link between these pages must reach a file, and a heading where it names one.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.environment import offline_env
from tests.harness.serving import ServiceProcess, start_service

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND_LANGUAGES = {"bash", "sh", "console"}
RUN_LANGUAGES = COMMAND_LANGUAGES | {"python"}
LANGUAGES = RUN_LANGUAGES | {"text", "json", "yaml", "ini"}
MARKER = re.compile(r"^<!--\s*(not-run|expect-status)\s*(?::\s*(.*?))?\s*-->$")
DOCUMENTED_SERVER = re.compile(r"^(?:https?://)?(?:localhost|127\.0\.0\.1):8000(?=/|$)")
PYTHON = re.compile(r"^(?:\S*/)?python3?(?:\.\d+)?$")
FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9-]*")
# Modules whose --help the flags are checked against; `benchmarks.X` modules are added as the pages name them.
CHECKED_MODULES = ("service", "export", "loadtests")
# Links to pages that another change writes (the re-layout's map of the code, issue 26). Checked once they exist.
# The demo repository is built by this command of docs/export.md (its path replaced by the test's own).
DEMO_COMMAND = ["python", "-m", "export", "demo", "--repository"]
TIMEOUT_S = 60


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason, where marked
    expect_status: int | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[str]:
        """Each command of a command block: continuation lines joined, comment-only and blank lines dropped."""
        if self.language == "console":
            lines = [line[2:] for line in self.text.splitlines() if line.startswith("$ ")]
        else:
            lines = self.text.splitlines()
        commands, current = [], ""
        for line in lines:
            current += line
            if current.endswith("\\"):
                current = current[:-1] + " "
                continue
            if not _quotes_closed(current):  # a quoted argument that goes on over the next line
                current += "\n"
                continue
            if current.strip() and not current.strip().startswith("#"):
                commands.append(current.strip())
            current = ""
        assert not current.strip(), f"{self.where}: a command that never ends: {current!r}"
        return commands


def _quotes_closed(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:
        return False
    return True


def parse(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start, language = i, lines[i][3:].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a fenced block that is never closed"
        not_run, expect_status = None, None
        j = start - 1
        while j >= 0 and (not lines[j].strip() or MARKER.match(lines[j].strip())):
            match = MARKER.match(lines[j].strip())
            if match and match[1] == "not-run":
                not_run = match[2] or ""
            elif match:
                expect_status = int(match[2]) if (match[2] or "").isdigit() else -1
            j -= 1
        blocks.append(Block(page, start + 1, language, "\n".join(lines[start + 1 : end]), not_run, expect_status))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in parse(page)]


def split_commands(command: str) -> Iterator[list[str]]:
    """The simple commands of a command line (split at &&, ||, ;, |), environment assignments dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in lexer:
        if token in {"&&", "||", ";", "|", "&"}:
            if words:
                yield words
            words = []
        elif words or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", token):
            words.append(token)
    if words:
        yield words


def python_module(words: list[str]) -> tuple[str, list[str]] | None:
    """(module, its arguments) for `python -m MODULE ...`, else None."""
    if len(words) >= 3 and PYTHON.match(words[0]) and words[1] == "-m":
        return words[2], words[3:]
    return None


def flags_by_module(blocks: list[Block]) -> dict[str, dict[str, list[str]]]:
    """module -> flag -> where the pages give it, over every command block, run or not."""
    found: dict[str, dict[str, list[str]]] = {}

    def add(module: str, flag: str, where: str) -> None:
        found.setdefault(module, {}).setdefault(flag, []).append(where)

    for block in blocks:
        if block.language not in COMMAND_LANGUAGES:
            continue
        for command in block.commands():
            for words in split_commands(command):
                parsed = python_module(words)
                if parsed is None or not (parsed[0] in CHECKED_MODULES or parsed[0].startswith("benchmarks.")):
                    continue
                module, args = parsed
                target, previous = module, ""
                for arg in (a.strip("[]") for a in args):
                    if arg == "--":  # benchmarks.reliability: what follows goes to python -m service
                        target = "service"
                    elif previous in ("--server-args", "--base-server-args"):  # a benchmark's string of server flags
                        for flag in FLAG.findall(arg):
                            add("service", flag, block.where)
                    elif arg.startswith("--"):
                        name, _, value = arg.partition("=")
                        add(target, name, block.where)
                        if name == "--server-arg" and value.startswith("--"):
                            add("service", value, block.where)
                    previous = arg
    return found


HELP_SCRIPT = """
import contextlib, io, json, runpy, sys
helps = {}
for module in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as exc:
            status = exc.code or 0
    helps[module] = {"status": status, "text": out.getvalue()}
print(json.dumps(helps))
"""


@functools.cache
def help_texts(modules: tuple[str, ...]) -> dict[str, str]:
    """`python -m MODULE --help` of each module, in one interpreter (the modules share their heavy imports)."""
    result = subprocess.run(
        [sys.executable, "-c", HELP_SCRIPT, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=offline_env(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    helps = json.loads(result.stdout.splitlines()[-1])
    failed = {module: help["status"] for module, help in helps.items() if help["status"] != 0}
    assert not failed, f"--help exited non-zero: {failed}"
    silent = [module for module, help in helps.items() if "usage:" not in help["text"]]
    assert not silent, f"--help printed no usage: {silent}"
    return {module: help["text"] for module, help in helps.items()}


def help_text(module: str) -> str:
    return help_texts((module,))[module]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """The demo repository, built by the docs' own command, served once for every example."""
    commands = [
        words
        for block in BLOCKS
        if block.not_run is None and block.language in COMMAND_LANGUAGES
        for command in block.commands()
        for words in split_commands(command)
        if words[:5] == DEMO_COMMAND
    ]
    assert commands, "docs/export.md no longer shows `python -m export demo --repository DIR`"
    work = tmp_path_factory.mktemp("docs-examples")
    repository = work / "models"
    started = time.monotonic()
    built = subprocess.run(
        [sys.executable, *commands[0][1:5], str(repository)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=offline_env(),
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    exported = time.monotonic()
    server = start_service(repository, "--log-level", "warning", log_path=work / "server.log")
    print(f"demo repository built in {exported - started:.1f} s, served {time.monotonic() - exported:.1f} s later")
    yield server
    server.stop()


def run_curl(words: list[str], server: ServiceProcess, out: Path) -> tuple[int, str, str]:
    """Run a documented curl call against `server`: (exit status, HTTP status, body)."""
    argv = [DOCUMENTED_SERVER.sub(server.url, word) for word in words]
    assert argv != words, f"a curl call that does not reach the documented server (localhost:8000): {words}"
    assert "-o" not in argv and "--output" not in argv, f"the test keeps the body itself: {words}"
    argv += ["--silent", "--show-error", "--max-time", str(TIMEOUT_S), "-o", str(out), "-w", "\n%{http_code}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S + 5)
    status = result.stdout.rsplit("\n", 1)[-1]
    return result.returncode, status, out.read_text(errors="replace") if out.exists() else result.stderr


def test_every_block_names_its_language_and_every_marker_its_reason() -> None:
    problems = []
    for block in BLOCKS:
        if block.language not in LANGUAGES:
            problems.append(f"{block.where}: fence language {block.language!r}, not one of {sorted(LANGUAGES)}")
        if block.not_run is not None and len(block.not_run) < 10:
            problems.append(f"{block.where}: `not-run` needs its reason (<!-- not-run: needs a Docker engine -->)")
        if block.expect_status is not None and not 100 <= block.expect_status <= 599:
            problems.append(f"{block.where}: `expect-status` needs an HTTP status (<!-- expect-status: 404 -->)")
        if block.expect_status is not None and block.not_run is not None:
            problems.append(f"{block.where}: an expected status on a block that is not run")
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.strip().startswith("<!--") and re.search(r"not-run|expect-status", line):
                assert MARKER.match(line.strip()), f"{page.relative_to(ROOT)}:{number}: malformed marker {line!r}"
    assert not problems, "\n".join(problems)


def test_the_readme_reaches_a_working_curl_in_one_screen() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    first_curl = next(number for number, line in enumerate(lines, 1) if line.startswith("curl "))
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move the depth to docs/"
    assert first_curl <= 60, f"the README's first curl is at line {first_curl}"
    runnable = [b for b in BLOCKS if b.page.name == "README.md" and b.not_run is None]
    for task in ("classify", "ner", "qa"):
        assert any(f"/{task} " in b.text for b in runnable), f"the README shows no curl call of /{task} that runs"


def test_documented_flags_exist() -> None:
    """Every --flag that a page gives python -m service / export / loadtests / benchmarks.X is in its --help."""
    found = flags_by_module(BLOCKS)
    assert {"service", "export"} <= found.keys()
    helps = help_texts(tuple(sorted(found)))
    missing = [
        f"{module} {flag} ({', '.join(sorted(set(where)))})"
        for module, flags in found.items()
        for flag, where in flags.items()
        if flag not in set(FLAG.findall(helps[module]))
    ]
    assert not missing, "flags the docs give that --help does not list:\n" + "\n".join(missing)


def test_links_between_the_pages_reach_their_targets() -> None:
    def anchors(page: Path) -> set[str]:
        slugs = set()
        for line in page.read_text().splitlines():
            if line.startswith("#"):
                title = re.sub(r"[`*]", "", line.lstrip("#").strip()).lower()
                slugs.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
        return slugs

    problems = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists():
                problems.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                problems.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert not problems, "\n".join(problems)


def test_the_examples_run_against_the_demo_server(demo_server: ServiceProcess, tmp_path: Path) -> None:
    started = time.monotonic()
    ran, problems = 0, []
    for block in BLOCKS:
        if block.not_run is not None or block.language not in RUN_LANGUAGES:
            continue
        if block.language == "python":
            assert DOCUMENTED_SERVER.search(block.text) or "127.0.0.1:8000" in block.text, block.where
            code = block.text.replace("127.0.0.1:8000", demo_server.url.removeprefix("http://"))
            code = code.replace("localhost:8000", demo_server.url.removeprefix("http://"))
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S)
            ran += 1
            if result.returncode != 0:
                problems.append(f"{block.where}: python exited {result.returncode}: {result.stderr[-1500:]}")
            continue
        for command in block.commands():
            for words in split_commands(command):
                if words[0] == "curl":
                    exit_status, status, body = run_curl(words, demo_server, tmp_path / f"body-{ran}")
                    ran += 1
                    expected = block.expect_status
                    ok = status == str(expected) if expected else status.startswith("2")
                    if exit_status != 0 or not ok:
                        want = expected or "2xx"
                        problems.append(
                            f"{block.where}: {command}\n  curl {exit_status}, HTTP {status} (want {want}): {body}"
                        )
                elif words[:5] == DEMO_COMMAND:
                    ran += 1  # what the demo_server fixture ran, into its own folder
                elif (parsed := python_module(words)) and parsed[1] == ["--help"]:
                    ran += 1
                    help_text(parsed[0])
                else:
                    problems.append(
                        f"{block.where}: `{command}` cannot run in a test: mark the block "
                        "<!-- not-run: REASON --> or make it a curl call to localhost:8000"
                    )
    print(f"{ran} documented commands run in {time.monotonic() - started:.1f} s")
    assert ran >= 15, f"only {ran} documented commands ran"
    assert not problems, "\n".join(problems)
