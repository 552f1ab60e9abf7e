"""Every code fence of the README runs: each ```python fence and each shell fence (```sh, ```bash,
```console) runs in a subprocess, in a temporary directory holding the files the README refers
to, against the loopback fake Messages API, so a user who copies one does not trip over it.

A fence that cannot run here is skipped only by the HTML comment on the line right before it,
which says why: ``<!-- fence: skip (needs a NATS server) -->``. There are few of them, each with
its reason (at most `MAX_SKIPS`). Two other markers start what a fence needs: ``nats`` a real
nats-server, and ``supervisor`` a real ``fisk-sm supervise`` on examples/deploys (see `served`).
Plain ``` fences are output samples, not code, and yaml fences are data (the agent.yaml of
"Running an agent" is written out for the others to use).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import natskit
import pytest
from crashkit import Lines
from ctlkit import DEADLINE, http, wait_until

import fisk_sm
from fisk_sm.testing import FakeMessagesAPI, Reply, first_user_text

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
SHELLS = {"sh", "bash", "console"}
#: The issue's budget of fences that may be skipped.
MAX_SKIPS = 8
#: A fence should finish in seconds; a hang fails the fence rather than the whole run.
TIMEOUT = 60.0

OPEN = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^\s*<!-- fence: (?P<body>.*?) -->\s*$")
SKIP = re.compile(r"^skip \((?P<reason>.*)\)$")

#: The fake Messages API's script per conversation (keyed by the prompt) for the fences whose
#: answer they check; every other request gets a plain text answer.
CONVERSATIONS = {
    # "Stepping a run": one tool call, then the run is suspended before it asks again.
    "What is (2 + 3) * 4?": [Reply.tool_use("multiply", {"a": 5, "b": 4}, id="tu_1")],
    # "Python API": the tool call, then the answer.
    "What is 2 + 3?": [Reply.tool_use("add", {"a": 2, "b": 3}, id="tu_1"), Reply.text("5")],
    # "The control API": examples/deploys' check, then its gated deploy (parks), then the answer.
    "Deploy the docs": [
        Reply.tool_use("check", {"site": "docs"}, id="toolu_00"),
        Reply.tool_use("deploy", {"site": "docs"}, id="toolu_01"),
        Reply.text("The docs are deployed."),
    ],
}

#: Runs a fence's source with README line numbers (a traceback names the README line), allowing
#: top-level `await` as the asyncio REPL does, so the README's snippets run as written.
DRIVER = """\
import ast, asyncio, inspect, sys
path, first = sys.argv[1], int(sys.argv[2])
source = "\\n" * first + open(path, encoding="utf-8").read()
code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, {"__name__": "__main__"})
if inspect.iscoroutine(result):
    asyncio.run(result)
"""


@attrs.frozen
class Fence:
    """One fenced block of the README."""

    lang: str
    line: int  # the line of the opening ``` (1-based)
    body: str
    marker: str | None  # the `<!-- fence: ... -->` comment right before it, if any

    @property
    def id(self) -> str:
        """The test id: language and README line."""
        return f"{self.lang or 'plain'}-L{self.line}"

    @property
    def needs_nats(self) -> bool:
        """Whether the fence runs against a nats-server (its marker is `nats`)."""
        return self.marker == "nats"

    @property
    def needs_supervisor(self) -> bool:
        """Whether the fence runs against a `fisk-sm supervise` (its marker is `supervisor`)."""
        return self.marker == "supervisor"

    @property
    def skip_reason(self) -> str | None:
        """Why the fence is skipped, from its marker (None: it runs)."""
        found = SKIP.match(self.marker or "")
        return found.group("reason").strip() if found else None


def parse(text: str) -> list[Fence]:
    """Every fenced block of `text`, with its language, its line and the marker before it."""
    lines = text.splitlines()
    fences: list[Fence] = []
    i = 0
    while i < len(lines):
        opened = OPEN.match(lines[i])
        if opened is None:
            i += 1
            continue
        indent = opened.group("indent")
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        before = MARKER.match(lines[i - 1]) if i else None
        fences.append(Fence(opened.group("lang"), i + 1, body, before and before.group("body")))
        i = end + 1
    return fences


FENCES = parse(README.read_text(encoding="utf-8"))
PYTHON = [f for f in FENCES if f.lang == "python"]
SHELL = [f for f in FENCES if f.lang in SHELLS]


def params(fences: list[Fence]) -> list[object]:
    """The fences as test parameters, a skipped one marked with its reason."""
    return [
        pytest.param(
            f, id=f.id, marks=[pytest.mark.skip(reason=f.skip_reason)] * bool(f.skip_reason)
        )
        for f in fences
    ]


# The extractor and the markers.


def test_the_extractor_finds_fences_with_language_line_and_marker() -> None:
    text = (
        "a\n```python\nx = 1\n```\n"
        "<!-- fence: skip (why) -->\n  ```sh\n  echo hi\n  ```\n"
        "```\nout\n```\n"
    )
    assert parse(text) == [
        Fence("python", 2, "x = 1\n", None),
        Fence("sh", 6, "echo hi\n", "skip (why)"),
        Fence("", 9, "out\n", None),
    ]
    assert [f.skip_reason for f in parse(text)] == [None, "why", None]


def test_the_readme_has_python_and_shell_fences() -> None:
    # Guards the extractor against finding nothing (then every parametrized test would vanish).
    assert len(PYTHON) >= 7
    assert len(SHELL) >= 15


def test_every_marker_sits_right_before_a_fence_and_says_why() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if "<!-- fence:" in line:
            assert MARKER.match(line), f"README.md:{number}: malformed fence marker"
            assert OPEN.match(lines[number]), (
                f"README.md:{number}: a fence marker not before a fence"
            )
    for fence in FENCES:
        if fence.marker is not None:
            assert fence.lang in SHELLS | {"python"}, (
                f"README.md:{fence.line}: marker on a {fence.lang} fence"
            )
            assert fence.skip_reason or fence.needs_nats or fence.needs_supervisor, (
                f"README.md:{fence.line}: a marker is `skip (REASON)`, `nats` or `supervisor`"
            )


def test_at_most_8_fences_are_skipped() -> None:
    skipped = [f"{f.id}: {f.skip_reason}" for f in FENCES if f.skip_reason]
    assert len(skipped) <= MAX_SKIPS, "\n".join(skipped)


def test_the_readme_fences_import_only_documented_names() -> None:
    """`from fisk_sm import X` names only `fisk_sm.__all__`; `from fisk_sm.sub import X` only
    what that subpackage exports (the root's one-line imports are checked by test_imports too)."""
    for fence in PYTHON:
        tree = ast.parse(fence.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fisk_sm"):
                module = importlib.import_module(node.module or "")
                exported = getattr(module, "__all__", ())
                for alias in node.names:
                    assert alias.name in exported, (
                        f"README.md:{fence.line + node.lineno}: {alias.name} is not in "
                        f"{node.module}.__all__"
                    )
    assert "Run" in fisk_sm.__all__


# Running the fences.


def answer(body: dict[str, object]) -> Reply:
    """Whatever a fence asks that no conversation script claims: a plain answer."""
    del body
    return Reply.text("done")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeMessagesAPI]:
    with FakeMessagesAPI(conversations=CONVERSATIONS, responder=answer) as api:
        yield api


@pytest.fixture
def workdir(tmp_path: Path, fake: FakeMessagesAPI) -> tuple[Path, dict[str, str]]:
    """A directory with the README's agent.yaml, the calculator's tools and the examples, and an
    environment pointed at the fake API, with its own state directory."""
    agent = next(f for f in FENCES if f.lang == "yaml" and f.body.startswith("# agent.yaml"))
    (tmp_path / "agent.yaml").write_text(agent.body, encoding="utf-8")
    shutil.copy(ROOT / "examples" / "calculator" / "calc_tools.py", tmp_path)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANTHROPIC_BASE_URL": fake.base_url,
        "ANTHROPIC_API_KEY": "test",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "NO_COLOR": "1",
        "PYTHONPATH": str(tmp_path),
    }
    env.pop("FISK_SM_URL", None)
    return tmp_path, env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a fence in its own process group, and end the group after it: nothing a fence
    starts (a server sent to the background) outlives its test."""
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            out, err = process.communicate(timeout=TIMEOUT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def check(done: subprocess.CompletedProcess[str], fence: Fence) -> None:
    assert done.returncode == 0, (
        f"README.md:{fence.line}: the {fence.lang} fence exited {done.returncode}\n"
        f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )


@pytest.mark.parametrize("fence", params(PYTHON))
def test_the_python_fence_runs(fence: Fence, workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    with served(fence, cwd, env) as (source, env):
        (cwd / "fence.py").write_text(source.body, encoding="utf-8")
        check(run([sys.executable, "-c", DRIVER, "fence.py", str(fence.line)], cwd, env), fence)


def script(fence: Fence) -> str:
    """The commands of a shell fence: a console fence's `$ ` lines (its other lines are output)."""
    if fence.lang != "console":
        return fence.body
    return "".join(line[2:] + "\n" for line in fence.body.splitlines() if line.startswith("$ "))


#: The NATS URL the README's examples use; a `nats` fence gets a real server's URL instead.
README_NATS = "nats://127.0.0.1:4222"


#: The placeholders of the control API's examples (not `$RUN` or `RUN=`: a shell variable).
PLACEHOLDER = re.compile(r"(?<![$\w])(?P<name>RUN|TOOL_USE_ID)(?![=\w])")
#: A shell comment (the examples quote no `#`).
COMMENT = re.compile(r"(?:^|\s+)#.*$", re.MULTILINE)
#: The examples' commands that stream until interrupted (Server-Sent Events).
STREAMING = re.compile(r"^(?=.*(?:curl -sN|ctl events --follow))", re.MULTILINE)
#: How a streaming command runs in a test: for a while, and still streaming (timeout's 124)
#: or done counts as success; a refused connection or a bad flag fails.
STREAM = 'streaming() { local rc=0; timeout 3 "$@" || rc=$?; [ $rc -eq 0 ] || [ $rc -eq 124 ]; }\n'


@contextlib.contextmanager
def served(fence: Fence, cwd: Path, env: dict[str, str]) -> Iterator[tuple[Fence, dict[str, str]]]:
    """The fence as it runs, and its environment: a `nats` fence runs against a real
    nats-server (tests/natskit.py), with agent.yaml's sessions in JetStream as the README's
    "JetStream sessions" shows; a `supervisor` fence against a real supervisor (`supervised`)."""
    if fence.needs_supervisor:
        with supervised(fence, cwd, env) as running:
            yield running
        return
    if not fence.needs_nats:
        yield fence, env
        return
    jetstream = next(f for f in FENCES if f.lang == "yaml" and "backend: jetstream" in f.body)
    with natskit.nats_server(cwd) as url:
        agent = cwd / "agent.yaml"
        agent.write_text(agent.read_text() + jetstream.body.replace(README_NATS, url))
        yield attrs.evolve(fence, body=fence.body.replace(README_NATS, url)), env


def progress(run: dict[str, Any]) -> tuple[object, ...]:
    """How far a run got: its status, iteration and transcript's length."""
    return run["status"], run["iteration"], len(run["transcript"])


@contextlib.contextmanager
def supervised(
    fence: Fence, cwd: Path, env: dict[str, str]
) -> Iterator[tuple[Fence, dict[str, str]]]:
    """`fisk-sm supervise` on examples/deploys (as "Supervising many runs" starts it) on a free
    loopback port, with `FISK_SM_URL` set as the README says. A fence with the placeholders
    `RUN` and `TOOL_USE_ID` gets a real run parked on its approval (one that posts `say`: a chat
    waiting for its next prompt); a streaming command runs for a while (`STREAM`)."""
    argv = ["fisk-sm", "supervise", "-c", "examples/deploys/agent.yaml", "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stderr is not None
    stderr = Lines(process.stderr)
    try:
        listening = stderr.wait_for("listening on", DEADLINE)
        found = re.search(r"http://127\.0\.0\.1:\d+", listening)
        assert found, listening
        env = {**env, "FISK_SM_URL": found.group()}
        url = found.group()
        # The commands without comments: a console fence's output and a comment say RUN too.
        body = COMMENT.sub("", script(fence))
        given: tuple[str, tuple[object, ...]] | None = None  # the run given, how far it got
        if PLACEHOLDER.search(body):
            chat = "/say" in body
            prompt = {"prompt": "hello", "chat": True} if chat else {"prompt": "Deploy the docs"}
            status, run = http("POST", url + "/api/runs", prompt)
            assert status == 201, (status, run)
            run_id = run["run_id"]
            want = "waiting" if chat else "parked"
            parked = wait_until(
                lambda: (r := http("GET", f"{url}/api/runs/{run_id}")[1])["status"] == want and r,
                f"run {run_id} to be {want}",
            )
            tool_use_id = (parked.get("approval") or {}).get("tool_use_id", "")
            values = {"RUN": run_id, "TOOL_USE_ID": tool_use_id}
            body = PLACEHOLDER.sub(lambda m: values[m.group("name")], body)
            given = f"{url}/api/runs/{run_id}", progress(parked)
        if STREAMING.search(body):
            body = STREAM + STREAMING.sub("streaming ", body)
        yield attrs.evolve(fence, lang="sh", body=body), env
        if given is not None:  # the fence's requests reached its run (not a 404 curl shrugs off)
            where, before = given
            wait_until(
                lambda: progress(http("GET", where)[1]) != before,
                f"README.md:{fence.line}: the fence to act on its RUN",
            )
    finally:  # the supervisor's group, as `run` ends a fence's
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        stderr.text()  # read to its end before the pipe closes
        process.stderr.close()


@pytest.mark.parametrize("fence", params(SHELL))
def test_the_shell_fence_runs(fence: Fence, workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    with served(fence, cwd, env) as (source, env):
        check(run(["bash", "-e", "-o", "pipefail", "-c", script(source)], cwd, env), fence)


def test_a_fence_is_found_by_first_user_text() -> None:
    # The conversation keys above are the prompts of the fences they answer.
    text = README.read_text(encoding="utf-8")
    for prompt in CONVERSATIONS:
        assert f'"{prompt}"' in text, prompt
    assert first_user_text({"messages": [{"role": "user", "content": "hi"}]}) == "hi"
