"""What starting costs, by what it imports ([13/19]): `fisk-sm ctl --help` loads neither typing
nor json, urllib or pathlib; `from fisk_sm import Run` loads neither asyncio, cattrs nor yaml,
nor the loop's modules (the first run made does); a run made builds no cattrs converter and
loads neither the exec tool's process machinery nor the memory tools; each is loaded where it
is used, and works there.

Each check runs in a fresh interpreter (this process has imported everything already) and
reports the modules the statement added to `sys.modules`. Timing itself is `bench/startup.py`'s
business: these tests assert outcomes (modules, results, journal lines), never durations.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import cattrs
import pytest

from fisk_sm.cli.helpformat import HelpFormatter, RawDescriptionHelpFormatter, terminal_columns
from fisk_sm.journal import records
from fisk_sm.journal.records import Meta, encode
from fisk_sm.testing import FakeMessagesAPI, Reply

ROOT = Path(__file__).resolve().parents[1]

#: json is imported after the measurement, so that the code's own use of it shows.
REPORT = """
import sys
before = set(sys.modules)
{code}
added = sorted(set(sys.modules) - before)
import json
print(json.dumps(added))
"""


def loaded(code: str, cwd: Path = ROOT) -> set[str]:
    """The modules `code` adds to `sys.modules` in a fresh interpreter (`code` must not write
    to stdout: the report is its last line)."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT.format(code=textwrap.dedent(code))],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(found)


def command(*args: str) -> str:
    """Code running `fisk-sm ARGS` as the console script does, its output swallowed."""
    return f"""
    import contextlib, io
    sys.argv = ["fisk-sm", *{list(args)!r}]
    from fisk_sm.cli import main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main()
    """


#: What `fisk-sm ctl --help` needs none of (some 10 ms together, a third of a bare interpreter):
#: shutil is what argparse would import to size the help (`fisk_sm.cli.helpformat`).
NOT_FOR_CTL_HELP = {"typing", "json", "urllib.parse", "pathlib", "shutil"}


def test_ctl_help_loads_no_typing_json_urllib_pathlib_or_shutil() -> None:
    modules = loaded(command("ctl", "--help"))
    assert "fisk_sm.cli.ctl" in modules  # the parser did come from the ctl module
    assert modules & NOT_FOR_CTL_HELP == set()


def test_top_level_help_loads_no_typing_or_shutil() -> None:
    modules = loaded(command("--help"))
    assert "fisk_sm.cli.main" in modules
    assert modules & {"typing", "shutil"} == set()


@pytest.mark.parametrize("columns", [None, "120", "41", "0", "-3", "abc", ""])
def test_the_help_is_as_wide_as_shutil_would_make_it(
    columns: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns
    # And the formatters pass it on as argparse's own would (less 2).
    ours = HelpFormatter("prog")._width
    theirs = argparse.HelpFormatter("prog")._width
    assert ours == theirs
    assert RawDescriptionHelpFormatter("prog", width=50)._width == 50  # given: kept


def test_ctl_still_loads_what_a_request_needs_when_it_sends_one(tmp_path: Path) -> None:
    """The lazy imports are reached: a request to nobody builds its URL, says exit 69."""
    code = """
    import contextlib, io, os
    os.environ["FISK_SM_URL"] = "http://127.0.0.1:9"
    sys.argv = ["fisk-sm", "ctl", "show", "run-1"]
    from fisk_sm.cli import main
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = main()
    assert code == 69, code
    assert "cannot connect to the supervisor at http://127.0.0.1:9" in err.getvalue()
    """
    modules = loaded(code, tmp_path)
    assert {"urllib.parse", "urllib.request", "urllib.error"} <= modules


def test_the_core_builds_no_converter_and_loads_no_exec_or_memory_tool() -> None:
    # A run made (`Run` alone imports the loop with its first run), of a config built in Python.
    modules = loaded("""
    from fisk_sm import Run, RunOptions
    from fisk_sm.config.agent import AgentConfig, LLMConfig
    from fisk_sm.loop.harness import NoModel
    Run.create(AgentConfig(LLMConfig("m")), "hi", RunOptions(model=NoModel()))
    """)
    assert {"fisk_sm.loop.run", "fisk_sm.loop.actions", "fisk_sm.journal.records"} <= modules
    assert "cattrs" not in modules  # the records' tagged union is built on first use, and so
    # is the config's converter
    lazy = {"fisk_sm.tools.exec", "fisk_sm.tools.process", "fisk_sm.tools.reaper"}
    lazy |= {"fisk_sm.tools.memory", "fisk_sm.tools.memory_tools", "secrets"}
    assert modules & lazy == set()


def test_an_exec_tool_and_the_memory_tools_still_load_when_configured(tmp_path: Path) -> None:
    code = """
    from fisk_sm import RunOptions, parse_config
    from fisk_sm.loop.harness import Harness, NoModel
    config = parse_config({
        "llm": {"model": "m"},
        "tools": [{"name": "hello", "description": "say hello", "command": ["echo", "hi"]}],
        "harness": {"memory": {"enabled": True, "options": {"directory": "memory"}}},
    }, env={})
    harness = Harness.build(config, RunOptions(model=NoModel()))
    names = sorted(harness.tools.tools)
    assert "hello" in names and "memory_write" in names, names
    """
    modules = loaded(code, tmp_path)
    assert {"fisk_sm.tools.exec", "fisk_sm.tools.memory", "fisk_sm.tools.memory_tools"} <= modules


def test_the_records_converter_is_built_once_on_first_use() -> None:
    """`records.converter` is still there (tests/test_journal_decode.py holds `decode` to it),
    one converter, the tagged union on `type` that reads back what `encode` writes."""
    converter = records.converter
    assert isinstance(converter, cattrs.Converter)
    assert records.converter is converter
    meta = Meta.new("run-1", {"model": "m"}, "hello")
    data = json.loads(encode(meta))
    assert data["type"] == "meta"
    assert converter.structure(data, records.Record) == meta


#: What `from fisk_sm import Run` must not load: the event loop (and ssl, socket, selectors under
#: it), cattrs (the config's converter) and yaml (agent.yaml, the loop table), each imported by
#: the first run made or config read.
NOT_FOR_THE_RUN_CLASS = {"asyncio", "cattrs", "yaml"}


def test_importing_run_loads_no_asyncio_cattrs_or_yaml() -> None:
    modules = loaded("from fisk_sm import Run")
    assert "fisk_sm.loop.run" in modules
    assert modules & NOT_FOR_THE_RUN_CLASS == set()


def test_importing_run_defines_the_class_and_loads_the_loop_with_the_first_run() -> None:
    """The class alone: the loop's modules (the actions, the harness, the machine, the config
    and the attrs classes under them) come with the first run made, not with the import."""
    modules = loaded("from fisk_sm import Run")
    later = {"attrs", "transitions", "fisk_sm.config.agent", "fisk_sm.loop.actions"}
    later |= {"fisk_sm.loop.harness", "fisk_sm.machine.evaluator", "fisk_sm.journal.records"}
    assert modules & later == set()
    made = loaded("""
    from fisk_sm import Run, RunOptions, parse_config
    from fisk_sm.loop.harness import NoModel
    config = parse_config({"llm": {"model": "m"}}, env={})
    run = Run.create(config, "hi", RunOptions(model=NoModel()))
    assert run.state == "suspend_check" and not run.finished, run.state
    """)
    assert later <= made


def test_the_loop_modules_leave_asyncio_cattrs_yaml_and_hashlib_to_where_they_are_used() -> None:
    """Each module defers them itself, not only `Run`: importing the loop's modules, the machine
    and the config classes loads none of them (nor the thread pool of `SyncRun`)."""
    modules = loaded("""
    import fisk_sm.loop.actions, fisk_sm.loop.fingerprint, fisk_sm.loop.sync, fisk_sm.loop.run
    import fisk_sm.machine.table, fisk_sm.model.anthropic, fisk_sm.operator.prompter
    from fisk_sm.config.agent import AgentConfig, LLMConfig
    """)
    assert {"fisk_sm.loop.actions", "fisk_sm.loop.harness", "fisk_sm.tools.worker"} <= modules
    deferred = NOT_FOR_THE_RUN_CLASS | {"hashlib", "concurrent.futures", "ssl", "socket"}
    assert modules & deferred == set()


def test_a_run_made_after_the_lazy_import_reads_its_config_and_runs(
    api: FakeMessagesAPI, tmp_path: Path
) -> None:
    """Everything the import no longer loads is loaded where it is used, and works there: the
    YAML file (yaml, cattrs), the run's steps (asyncio, the actions), a tool call on a thread and
    its timeout, the fingerprint (hashlib) and the journal."""
    (tmp_path / "tools.py").write_text("def add(a: int, b: int) -> int:\n    return a + b\n")
    config = {
        "llm": {"model": "m", "base_url": api.base_url, "budget": {"call_timeout": "30s"}},
        "tools": [{"python": "tools:add", "timeout": 30}],
    }
    (tmp_path / "agent.yaml").write_text(json.dumps(config))  # JSON is YAML
    api.add(Reply.tool_use("add", {"a": 2, "b": 3}, id="tu_1"), Reply.text("5"))
    code = """
    from fisk_sm import Run
    assert not {"asyncio", "cattrs", "yaml"} & set(sys.modules)
    import asyncio, os
    from fisk_sm import MemoryJournal, RunOptions, load_config
    os.environ["ANTHROPIC_API_KEY"] = "k"

    async def main():
        journal = MemoryJournal()
        config = load_config("agent.yaml", env={})
        async with Run.create(config, "add 2 and 3", RunOptions(journal=journal)) as run:
            assert await run.run() == "completed", run.state
            assert run.answer() == "5", run.answer()
            kinds = [type(r).__name__ for r in journal.records]
            assert kinds[0] == "Meta" and kinds[-1] == "Terminal", kinds
            assert len(journal.records[0].fingerprint["tools_hash"]) == 64

    asyncio.run(main())
    """
    modules = loaded(code, tmp_path)
    assert {"asyncio", "cattrs", "yaml", "hashlib"} <= modules
    assert len(api.requests) == 2
    assert api.requests[0]["messages"][0]["content"][0]["text"] == "add 2 and 3"
    result = api.requests[1]["messages"][2]["content"][0]
    assert (result["type"], result["content"]) == ("tool_result", "5")
