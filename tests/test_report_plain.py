"""`fisk-sm report`, the dashboard's diagram and `fisk-sm diagram` on a plain install: no
pygraphviz.

"Without pygraphviz": the command line runs from a second venv made for the test, holding
every package of this one but pygraphviz (as an install without the `[svg]` extra); the
supervisor, which its test kit starts with this interpreter, runs with a `sitecustomize` that
blocks the import. Each fixture checks that `import pygraphviz` fails there. The session is
recorded with the real CLI on a pseudo-terminal (the operator approves the gated `deploy` once)
against the fake Messages API; the report is opened in headless Chromium (tests/browserkit.py),
which finds the approval and who answered it when, the tool names with their durations, the
model calls with their latency, and the path marked on the shipped SVG. A table other than the
one the shipped SVG was drawn from is never marked on it: Graphviz
draws it when installed, else the page shows the mermaid text and says why.

The Chromium test is a plain `def`: Playwright's sync API refuses to run inside an event loop.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest
from apikit import send
from browserkit import chromium_path
from ctlkit import Supervisor
from test_table_extended import extended

from fisk_sm.machine import diagram
from fisk_sm.machine.diagram import DiagramError, dot, path_drawing, render, shipped_svg_path
from fisk_sm.machine.svgmark import NodeMark, SvgMarkError, digest, drawn_from, mark
from fisk_sm.machine.table import load_table
from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "fisk_sm.cli"]
SVG = "{http://www.w3.org/2000/svg}"
HANG = 60  # a guard against a hang, far above what any machine needs
TOOLS = '''
def deploy(target: str) -> str:
    """Deploy a target.

    Args:
        target: where to
    """
    return "deployed " + target


def look(what: str) -> str:
    """Look at something.

    Args:
        what: what to look at
    """
    return "saw " + what
'''


@pytest.fixture
def plain_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a supervisor subprocess (started with this interpreter) in which
    `import pygraphviz` fails: its `sitecustomize` (first on PYTHONPATH) blocks the import."""
    site = tmp_path / "no_pygraphviz"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        'import sys\nsys.modules["pygraphviz"] = None  # an install without [svg]\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["ANTHROPIC_API_KEY"] = "test"
    probe = subprocess.run(
        [sys.executable, "-c", "import pygraphviz"], env=env, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "pygraphviz" in probe.stderr, probe
    return env


@pytest.fixture(scope="module")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the command line run from a second venv: every package of this one
    (fisk-sm included, as installed) linked into it, except pygraphviz, as on an install
    without the `[svg]` extra. Its `python` is first on PATH (`fisk` runs it)."""
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = next((venv / "lib").glob("python3*/site-packages"))
    for entry in ours.iterdir():
        if not entry.name.lower().startswith("pygraphviz"):
            (theirs / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FISK_SM_")}
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["ANTHROPIC_API_KEY"] = "test"
    python = str(venv / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import pygraphviz"], env=env, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "No module named 'pygraphviz'" in probe.stderr, probe
    here = subprocess.run(
        [python, "-c", "import sys, fisk_sm; print(sys.prefix)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert here.stdout.strip() == str(venv)
    return env


def fisk(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`fisk-sm ARGS` with the `python` first on the PATH of `env` (the plain venv's)."""
    python = shutil.which("python", path=env["PATH"]) or sys.executable
    command = [python, *CLI[1:], *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=HANG)


@pytest.fixture
def approved(tmp_path: Path) -> Iterator[Path]:
    """Session `appr` in tmp_path/state: `deploy` (gated, approved once), then `look`."""
    (tmp_path / "appr_tools.py").write_text(TOOLS)
    script = [
        Reply.tool_use("deploy", {"target": "prod <eu>"}, id="toolu_d1"),
        Reply.tool_use("look", {"what": "logs"}, id="toolu_l1"),
        Reply.text("deployed and looked"),
    ]
    with FakeMessagesAPI(script) as api:
        (tmp_path / "agent.yaml").write_text(
            f"llm: {{model: m, base_url: '{api.base_url}'}}\n"
            "tools: [{python: 'appr_tools:deploy', tags: [ai:confirm]},"
            " {python: 'appr_tools:look'}]\n"
        )
        env = {**os.environ, "ANTHROPIC_API_KEY": "test"}
        argv = ["run", "-c", "agent.yaml", "--state-dir", "state", "--checkpoint"]
        child = pexpect.spawn(
            CLI[0],
            [*CLI[1:], *argv, "--name", "appr", "deploy then look"],
            cwd=str(tmp_path),
            env=env,
            encoding="utf-8",
            timeout=HANG,
            dimensions=(50, 200),
        )
        child.expect_exact("[o]nce / [a]lways / [N]o: ")
        child.sendline("o")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0, child.before
        assert len(api.requests) == 3
    yield tmp_path / "state"


def test_the_shipped_svg_is_the_table_drawn_and_goes_in_the_wheel() -> None:
    where = shipped_svg_path()
    assert where == ROOT / "diagrams" / "agent_loop.svg"
    shipped = where.read_text(encoding="utf-8")
    assert drawn_from(shipped) == digest(dot(load_table()))
    try:
        import pygraphviz  # noqa: F401
    except ImportError:
        pass
    else:  # regenerating gives the same bytes
        assert diagram.graphviz_svg(load_table()) == shipped
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    included = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert included["diagrams/agent_loop.svg"] == "fisk_sm/_diagrams/agent_loop.svg"
    assert diagram._SHIPPED[0].relative_to(ROOT) == Path("fisk_sm/_diagrams/agent_loop.svg")


def test_report_without_pygraphviz_in_chromium(
    approved: Path, plain_venv: dict[str, str], tmp_path: Path
) -> None:
    try:
        from playwright import sync_api
    except ImportError as e:
        pytest.skip(f"playwright is not importable ({e})")
    browser_path = chromium_path()
    if browser_path is None:
        pytest.skip("no chromium binary (apt-get install chromium, or set $FISK_SM_CHROMIUM)")
    out = tmp_path / "report.html"
    out.write_text("an older report, world-readable")
    out.chmod(0o644)
    got = fisk(plain_venv, "report", "appr", "--state-dir", str(approved), "-o", str(out))
    assert got.returncode == 0, got.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # tightened, not just created so
    page_text = out.read_text(encoding="utf-8")
    assert "older report" not in page_text
    for outside in ("<script", "<link", " src=", "href=", "@import", "url("):
        assert outside not in page_text.lower(), outside

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, headless=True, timeout=60_000)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.set_default_timeout(30_000)
            page.goto(out.as_uri(), wait_until="load")
            # The approval: tool, input, answer, and who answered it (the terminal) when.
            row = page.locator("table.approvals tr.approval")
            assert row.count() == 1
            assert row.locator("td.tool").inner_text() == "deploy"
            assert json.loads(row.locator("pre").inner_text()) == {"target": "prod <eu>"}
            assert row.locator("td.answer").inner_text() == "once"
            who = row.locator("td.who").inner_text()
            assert re.fullmatch(r"terminal at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", who), who
            assert row.locator("td.unknown").count() == 0
            body = page.locator("body").inner_text()
            assert "not journaled" not in body and "written before" not in body
            # The timeline: model calls with tokens and latency, the tools by name with their
            # durations, each as journaled by this run.
            names = page.locator("table.timeline td.name").all_inner_texts()
            assert names == [
                "model call 1 (tool_use)", "deploy", "model call 2 (tool_use)", "look",
                "model call 3 (end_turn)",
            ]  # fmt: skip
            timeline = page.locator("table.timeline").inner_text()
            assert "asks for deploy" in timeline and "in 10 out 5" in timeline
            took = page.locator("table.timeline td.took").all_inner_texts()
            assert len(took) == 5 and page.locator("table.timeline td.unknown").count() == 0
            assert all(re.fullmatch(r"\d+ ms|\d+\.\d s", t) for t in took), took
            # The path, marked on the shipped SVG.
            svg = page.locator(".diagram svg")
            assert svg.count() == 1
            assert "visited" in (svg.locator("#state_execute").get_attribute("class") or "")
            assert "×2" in (svg.locator("#state_execute").text_content() or "")
            assert "current" in (svg.locator("#state_completed").get_attribute("class") or "")
            assert svg.locator("#state_awaiting_approval.visited").count() == 1
            assert svg.locator("#state_failed.unvisited").count() == 1
            fired = svg.locator("g.edge.fired")
            assert fired.count() >= 10
            assert svg.locator("#gate__gated__awaiting_approval.fired").count() == 1
            fill = svg.locator("#state_execute path").first.evaluate(
                "e => getComputedStyle(e).fill"
            )
            assert fill == "rgb(219, 234, 254)"  # the visited fill, drawn
            # Readable at page width: shown at its own size (scrolling), text of >= 12px...
            text_box = svg.locator("#state_execute text").first.bounding_box()
            assert text_box is not None and text_box["height"] >= 12, text_box
            box = svg.bounding_box()
            assert box is not None and box["width"] > 1280, box
            # ...and "fit to the page width" shrinks it into the page.
            page.locator("label[for=fit]").click()
            box = svg.bounding_box()
            assert box is not None and box["width"] <= 1280, box
        finally:
            browser.close()


def test_report_exit_codes_without_pygraphviz(
    approved: Path, plain_venv: dict[str, str], tmp_path: Path
) -> None:
    where = ["--state-dir", str(approved)]
    ok = fisk(plain_venv, "report", "appr", *where)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("<!DOCTYPE html>") and "state_execute" in ok.stdout
    drawn = fisk(plain_venv, "diagram", "--session", "appr", *where, "--format", "svg")
    assert drawn.returncode == 0, drawn.stderr
    marked = {g.get("id"): g.get("class", "") for g in ET.fromstring(drawn.stdout).iter(f"{SVG}g")}
    assert "visited" in marked["state_awaiting_approval"] and "current" in marked["state_completed"]
    missing = fisk(plain_venv, "report", "nope", *where)
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1 and "nope" in missing.stderr
    nowhere = fisk(plain_venv, "report", "appr", *where, "-o", str(tmp_path / "no" / "r.html"))
    assert nowhere.returncode != 0
    lines = nowhere.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in nowhere.stderr and "r.html" in lines[0]


def test_dashboard_diagram_without_pygraphviz(
    tmp_path: Path, plain_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", plain_env["PYTHONPATH"])  # the supervisor's environment
    with FakeMessagesAPI() as api, Supervisor(tmp_path, api) as sup:
        api.add_conversation("look please", Reply.tool_use("look", {"what": "x"}), Reply.text("ok"))
        run_id = sup.submit("look please")
        sup.wait_status(run_id, "completed")
        got = send(sup, "GET", f"/api/runs/{run_id}/diagram.svg")
        assert got.status == 200, got
        assert got.headers["content-type"].startswith("image/svg+xml")
        assert got.headers.get("x-content-type-options") == "nosniff"  # defences kept
        root = ET.fromstring(got.body)
        classes = {g.get("id"): g.get("class", "") for g in root.iter(f"{SVG}g")}
        assert "visited" in classes["state_execute"]
        assert "current" in classes["state_completed"]
        assert "unvisited" in classes["state_awaiting_approval"]
        fired = {k for k, c in classes.items() if k and "fired" in c.split()}
        assert any(k.startswith("execute__") for k in fired), fired
        assert "gate__gated__awaiting_approval" not in fired  # nothing was gated


def test_a_mismatched_table_falls_back_and_says_so(
    tmp_path: Path, plain_venv: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    table_file = extended(tmp_path)
    table = load_table(table_file)
    shipped = shipped_svg_path()
    assert shipped is not None
    # Never marked on the wrong drawing: a state the drawing lacks is refused.
    with pytest.raises(SvgMarkError, match="state_refused_tool"):
        mark(shipped.read_text(), {"state_refused_tool": NodeMark("visited")}, {})
    # Without Graphviz: the mermaid text, and why.
    monkeypatch.setitem(sys.modules, "pygraphviz", None)
    drawing = path_drawing(table)
    assert drawing.kind == "mermaid" and "refused_tool" in drawing.text
    assert drawing.note is not None and "differs" in drawing.note and "mermaid" in drawing.note
    with pytest.raises(DiagramError, match="differs"):
        render(table, "svg")
    got = fisk(plain_venv, "diagram", "--table", str(table_file), "--format", "svg")
    assert got.returncode == 2 and not got.stdout
    assert len(got.stderr.strip().splitlines()) == 1 and "differs" in got.stderr
    assert "Traceback" not in got.stderr
    # The loop's own table is drawn from the shipped SVG all the same.
    plain = fisk(plain_venv, "diagram", "--format", "svg")
    assert plain.returncode == 0 and plain.stdout == shipped.read_text()
    monkeypatch.delitem(sys.modules, "pygraphviz")
    try:
        import pygraphviz  # noqa: F401
    except ImportError:
        return
    # With Graphviz: drawn by it, stamped with the extended table's digest, and said so.
    drawing = path_drawing(table)
    assert drawing.kind == "svg" and "state_refused_tool" in drawing.text
    assert drawn_from(drawing.text) == digest(dot(table)) != drawn_from(shipped.read_text())
    assert drawing.note is not None and "drawn by Graphviz" in drawing.note
